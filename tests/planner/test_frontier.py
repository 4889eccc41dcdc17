"""The frontier over curves and the n*(C) law, against brute force."""

import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from isojax.planner import frontier
from isojax.planner import sigmoid_fit
from isojax.planner import synthetic

_SETTINGS = settings(max_examples=60, deadline=None, database=None)


def _exact_fit(curve):
  """A SigmoidFit carrying a known curve's parameters (no fitting involved)."""
  return sigmoid_fit.SigmoidFit(r0=curve.r0, a=curve.a, b=curve.b, c_mid=curve.c_mid,
                                a_stderr=0.0, rmse=0.0, num_points=0,
                                compute_range=(1.0, 1e7), r0_fixed=True)


_CURVES = synthetic.paper_like_curves([16, 64], [2, 4, 8, 16, 32, 64, 128], n_saturation=32)


def test_envelope_equals_brute_force_argmax():
  c_E = frontier.compute_grid(1e3, 1e7, 97)
  points = frontier.fitted_frontier([c.key for c in _CURVES], [_exact_fit(c) for c in _CURVES],
                                    c_E)
  for p, c in zip(points, c_E):
    values = [curve(c) for curve in _CURVES]  # brute force: evaluate every curve
    best = int(np.argmax(values))
    assert (p.problems_per_batch, p.rollouts_per_problem) == _CURVES[best].key
    assert p.value == pytest.approx(values[best])
  n_star = [p.rollouts_per_problem for p in points]
  assert n_star[0] == 2 and n_star[-1] == 32  # rises from the smallest n, saturates at 32


def test_envelope_respects_each_curve_compute_limit():
  fits = [_exact_fit(c) for c in _CURVES]
  c_E = frontier.compute_grid(1e3, 1e7, 41)
  limits = [1e5 if c.rollouts_per_problem >= 16 else 1e7 for c in _CURVES]
  best_E, value_E = frontier.upper_envelope(fits, c_E, limits)
  for k, v, c in zip(best_E, value_E, c_E):
    eligible = [i for i, lim in enumerate(limits) if c <= lim]
    expected = max(eligible, key=lambda i: (_CURVES[i](c), -i))
    assert k == expected and v == pytest.approx(_CURVES[expected](c))
  best_E, _ = frontier.upper_envelope(fits, [2e7], [1.0] * len(fits))
  assert best_E.tolist() == [-1]  # no eligible curve


points_strategy = st.lists(
    st.tuples(st.integers(0, 20).map(float), st.integers(0, 10 ** 6), st.sampled_from([1, 2, 4])),
    min_size=1, max_size=40, unique_by=lambda p: p[1])


@_SETTINGS
@given(raw=points_strategy)
def test_empirical_frontier_is_the_set_of_undominated_points(raw):
  points = [(c, v / 1e6, (8, n)) for c, v, n in raw]  # distinct values
  got = {(p.rollouts, p.value) for p in frontier.empirical_frontier(points)}
  expected = {(c, v) for c, v, _ in points
              if not any(cq <= c and vq > v for cq, vq, _ in points)}
  assert got == expected
  rollouts = [p.rollouts for p in frontier.empirical_frontier(points)]
  assert rollouts == sorted(rollouts)


def test_n_star_law_recovers_a_known_law_from_a_power_of_two_frontier():
  true = frontier.NStarLaw(log2_n_low=2.0, log2_n_high=7.0, b=0.9, c_mid=1e5,
                           compute_range=(1e2, 1e8))
  c_E = frontier.compute_grid(1e2, 1e8, 200)
  n_E = 2.0 ** np.round(true.log2_n_star(c_E))  # what a frontier of powers of two shows
  law = frontier.fit_n_star_law(c_E, n_E)
  assert law.log2_n_low == pytest.approx(2.0, abs=0.3)
  assert law.log2_n_high == pytest.approx(7.0, abs=0.3)
  assert law.c_mid == pytest.approx(1e5, rel=0.3)
  assert law.b == pytest.approx(0.9, rel=0.3)
  sat = law.saturation_compute()
  assert sat == pytest.approx(true.saturation_compute(), rel=0.5)
  assert law.to_dict()["saturated_within_range"]


def test_law_saturation_and_round_trip():
  law = frontier.NStarLaw(log2_n_low=3.0, log2_n_high=7.0, b=1.5, c_mid=2e4,
                          compute_range=(1e3, 1e5))
  sat = law.saturation_compute(0.9)
  assert float(law.log2_n_star(sat)) == pytest.approx(3.0 + 0.9 * 4.0)
  assert float(law.n_star(2e4)) == pytest.approx(2 ** 5.0)
  d = law.to_dict()
  assert d["n_saturation"] == 128 and d["n_low"] == 8
  assert d["saturated_within_range"] == (sat <= 1e5)
  assert frontier.NStarLaw.from_dict(d) == law
  with pytest.raises(ValueError, match="n\\*\\(C\\) law"):
    frontier.NStarLaw.from_dict({"b": 1.0})


def test_fixed_batch_frontier_gives_n_star_of_m_and_b_p_star():
  # Every factorisation of B = 256 into B_p * n, on a steps axis.
  curves = [c for c in synthetic.paper_like_curves([2, 4, 8, 16, 32, 64, 128],
                                                   [2, 4, 8, 16, 32, 64, 128], n_saturation=64)
            if c.problems_per_batch * c.rollouts_per_problem in (256, 512)]
  keys = [c.key for c in curves]
  groups = frontier.group_frontiers(keys, [_exact_fit(c) for c in curves], [1e7] * len(curves),
                                    by="batch_rollouts", num=50)
  assert sorted(groups) == [256, 512]
  group = groups[256]
  members = [c for c in curves if c.problems_per_batch * c.rollouts_per_problem == 256]
  for p in group["frontier"]:
    best = max(members, key=lambda c: c(p.rollouts))  # brute force at this compute
    assert (p.problems_per_batch, p.rollouts_per_problem) == best.key
    assert p.problems_per_batch == 256 // p.rollouts_per_problem  # B_p*(M) = B / n*(M)
  law = group["law"]
  assert law.unit == "num_steps"
  steps = [p.rollouts / 256 for p in group["frontier"]]
  assert law.compute_range == pytest.approx((min(steps), max(steps)))


def test_group_by_problems_per_batch_needs_two_n():
  curves = [c for c in _CURVES if c.problems_per_batch == 64] + [
      synthetic.TrueCurve(8, 4, 0.1, 0.5, 1.0, 1e3)]
  groups = frontier.group_frontiers([c.key for c in curves], [_exact_fit(c) for c in curves],
                                    [1e7] * len(curves), by="problems_per_batch", num=16)
  assert list(groups) == [64]  # B_p = 8 has a single n: no frontier over n
  assert all(p.problems_per_batch == 64 for p in groups[64]["frontier"])
  assert math.isfinite(groups[64]["law"].log2_n_high)
