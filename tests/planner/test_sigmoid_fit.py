"""The sigmoid fit recovers known parameters under noise; its uncertainty is honest.

Tolerances (noise sd 0.01, 40 log-spaced evaluations from C_mid / 20 to 20 C_mid):
A within 0.03, B within 25%, C_mid within 30%.
"""

import numpy as np
import pytest

from isojax.planner import sigmoid_fit

_CASES = [  # (r0, a, b, c_mid)
    (0.10, 0.70, 1.3, 2e4),
    (0.05, 0.45, 0.8, 5e5),
    (0.20, 0.90, 2.0, 3e3),
]


def _data(params, seed, noise=0.01, num=40, span=20.0):
  r0, a, b, c_mid = params
  c_E = np.geomspace(c_mid / span, c_mid * span, num)
  rng = np.random.default_rng(seed)
  return c_E, sigmoid_fit.sigmoid(c_E, r0, a, b, c_mid) + rng.normal(0, noise, num)


def test_sigmoid_formula():
  # R0 + (A - R0) / (1 + (C_mid / C)^B) at hand-picked points; R(0) = R0.
  c = np.array([0.0, 100.0, 400.0])
  expected = [0.1, 0.1 + 0.6 / 2, 0.1 + 0.6 / (1 + (100 / 400) ** 2)]
  np.testing.assert_allclose(sigmoid_fit.sigmoid(c, 0.1, 0.7, 2.0, 100.0), expected)


@pytest.mark.parametrize("params", _CASES)
@pytest.mark.parametrize("fixed_r0", [True, False])
def test_fit_recovers_known_parameters(params, fixed_r0):
  r0, a, b, c_mid = params
  for seed in range(3):
    c_E, r_E = _data(params, seed)
    fit = sigmoid_fit.fit_sigmoid(c_E, r_E, r0=r0 if fixed_r0 else None, lower=0, upper=1)
    assert fit.a == pytest.approx(a, abs=0.03)
    assert fit.b == pytest.approx(b, rel=0.25)
    assert fit.c_mid == pytest.approx(c_mid, rel=0.3)
    if not fixed_r0:
      assert fit.r0 == pytest.approx(r0, abs=0.05)
    assert fit.rmse < 0.015 and not fit.flat


def test_asymptote_stderr_matches_the_spread_over_repetitions():
  params = _CASES[0]
  estimates, stderrs = [], []
  for seed in range(40):
    c_E, r_E = _data(params, seed, num=30)
    fit = sigmoid_fit.fit_sigmoid(c_E, r_E, r0=params[0], lower=0, upper=1)
    estimates.append(fit.a)
    stderrs.append(fit.a_stderr)
  spread = np.std(estimates, ddof=1)
  assert 0.6 < np.mean(stderrs) / spread < 1.6
  assert abs(np.mean(estimates) - params[1]) < 3 * spread / np.sqrt(40) + 1e-3


def test_bootstrap_interval_covers_the_true_asymptote():
  params = _CASES[0]
  c_E, r_E = _data(params, seed=7, num=30)
  fit = sigmoid_fit.fit_sigmoid(c_E, r_E, r0=params[0], lower=0, upper=1)
  boot = sigmoid_fit.bootstrap_asymptote(c_E, r_E, fit, num_resamples=60, seed=0,
                                         lower=0, upper=1)
  assert boot["a_low"] <= params[1] <= boot["a_high"]
  assert 0.5 < boot["a_stderr"] / fit.a_stderr < 2.0
  again = sigmoid_fit.bootstrap_asymptote(c_E, r_E, fit, num_resamples=60, seed=0,
                                          lower=0, upper=1)
  assert again == boot  # deterministic for a seed


def test_flat_curve_gives_a_flat_fit():
  rng = np.random.default_rng(0)
  c_E = np.linspace(100, 2000, 20)
  r_E = 0.3 + rng.normal(0, 0.01, 20)
  fixed = sigmoid_fit.fit_sigmoid(c_E, r_E, r0=0.3, lower=0, upper=1)
  assert fixed.flat and fixed.a == 0.3
  free = sigmoid_fit.fit_sigmoid(c_E, r_E)
  assert free.flat and free.a == pytest.approx(r_E.mean())
  assert free.a_stderr == pytest.approx(r_E.std(ddof=1) / np.sqrt(20))
  np.testing.assert_allclose(free.predict(c_E), r_E.mean())


def test_short_curves_get_finite_bounded_fits():
  # Three evaluations: no residual degrees of freedom, so A is undetermined (inf
  # stderr), but the curve still passes through the points within the bounds.
  c_E, r_E = np.array([100.0, 200.0, 400.0]), np.array([0.2, 0.3, 0.35])
  fit = sigmoid_fit.fit_sigmoid(c_E, r_E, r0=0.1, lower=0, upper=1)
  assert np.isinf(fit.a_stderr) and 0.35 <= fit.a <= 1.0
  np.testing.assert_allclose(fit.predict(c_E), r_E, atol=0.02)
  with pytest.raises(ValueError, match="at least 3"):
    sigmoid_fit.fit_sigmoid([0.0, 100.0, 200.0], [0.1, 0.2, 0.3])


def test_fit_is_monotone_non_decreasing_on_falling_data():
  c_E = np.geomspace(10, 1e4, 12)
  fit = sigmoid_fit.fit_sigmoid(c_E, np.linspace(0.5, 0.2, 12), lower=0, upper=1)
  assert fit.a >= fit.r0
  assert np.all(np.diff(fit.predict(c_E)) >= -1e-12)


def test_a_fitted_r0_keeps_the_asymptote_within_the_bounds():
  """Values still climbing steeply at the last point, bounded by [1, 6] (log2 of the n
  swept): with R0 fitted, the asymptote may not pass the upper bound (it reached
  R0 + upper - lower when only the gain was bounded). Brute force over A at the bound
  gives the constrained optimum's residual, which the fit must match or beat."""
  c_E = np.geomspace(1e3, 1e5, 12)
  r_E = np.clip(1.0 + 5.5 * np.log10(c_E / 1e3) / 2.0, 1.0, 6.5)  # ends at 6.5 > 6
  fit = sigmoid_fit.fit_sigmoid(c_E, r_E, lower=1.0, upper=6.0)
  assert 1.0 <= fit.r0 <= fit.a <= 6.0 + 1e-9
  rss = float(np.sum((fit.predict(c_E) - r_E) ** 2))
  best = min(float(np.sum((sigmoid_fit.sigmoid(c_E, r0, 6.0, b, cm) - r_E) ** 2))
             for r0 in np.linspace(1.0, 2.0, 11) for b in np.geomspace(0.5, 5, 19)
             for cm in np.geomspace(1e3, 1e5, 25))
  assert rss <= best * 1.02


def test_compute_at_fraction_inverts_the_curve():
  fit = sigmoid_fit.fit_sigmoid(*_data(_CASES[0], 0), r0=0.1, lower=0, upper=1)
  c90 = fit.compute_at_fraction(0.9)
  assert fit.predict(c90) == pytest.approx(fit.r0 + 0.9 * (fit.a - fit.r0))


def test_extrapolation_check_predicts_the_end_from_the_first_half():
  params = (0.1, 0.7, 1.3, 2e4)
  c_E = np.linspace(0, 2e5, 50)  # evaluations every few steps, as the main loop logs them
  rng = np.random.default_rng(3)
  r_E = sigmoid_fit.sigmoid(c_E, *params) + rng.normal(0, 0.005, 50)
  check = sigmoid_fit.extrapolation_check(c_E, r_E, r0=0.1, lower=0, upper=1)
  assert check["fit_max_rollouts"] <= 1e5 and check["target_rollouts"] == 2e5
  true_end = sigmoid_fit.sigmoid(c_E[-3:], *params).mean()
  assert check["predicted"] == pytest.approx(true_end, abs=0.02)
  assert check["error"] == pytest.approx(check["predicted"] - r_E[-3:].mean())
  # Persistence: the window's last value carried forward.
  last_in_window = r_E[c_E <= 1e5][-1]
  assert check["persistence_error"] == pytest.approx(last_in_window - r_E[-3:].mean())


def test_extrapolation_check_observes_only_after_its_fit_window():
  """Log-spaced evaluations whose second-to-last lies inside the window: the observed
  value is the last evaluation alone, never one the fit saw."""
  c_E = np.array([0.0, 1e3, 3e3, 1e4, 3e4, 6e4, 1.3e5])  # 6e4 <= 0.5 * 1.3e5
  r_E = np.array([0.1, 0.15, 0.25, 0.4, 0.55, 0.6, 0.62])
  check = sigmoid_fit.extrapolation_check(c_E, r_E, r0=0.1, lower=0, upper=1, tail=2)
  assert check["observed_rollouts"] == [1.3e5] and check["observed"] == 0.62
  assert check["persistence"] == 0.6
  with pytest.raises(ValueError, match="no evaluation after the fit window"):
    sigmoid_fit.extrapolation_check(c_E, r_E, fraction=1.0, r0=0.1, lower=0, upper=1)


def test_to_dict_round_trip():
  fit = sigmoid_fit.fit_sigmoid([100.0, 200.0, 400.0], [0.2, 0.3, 0.35], r0=0.1)
  d = fit.to_dict()
  assert d["a_stderr"] is None  # inf is not JSON
  assert sigmoid_fit.SigmoidFit.from_dict(d) == fit
