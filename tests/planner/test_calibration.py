"""The verdict machinery calibrated on synthetic truths (NumPy only).

Intervals must cover a known slope at about their nominal 90%, a null family must give
a yes or a no at most at the nominal family-wise rate, and each claim's statistic must
find an effect planted in synthetic runs and none in a null. The sizes (studies,
resamples) and the bands (nominal +- about two binomial standard errors) are fixed in
advance; docs/results/calibration.md has the same rates at larger sizes.
"""

import math

import numpy as np
import pytest

from isojax import metrics
from isojax.eval_settings import EvalSettings
from isojax.planner import bootstrap
from isojax.planner import calibration
from isojax.planner import experiments
from isojax.planner import n_star
from isojax.planner import records

STUDIES, RESAMPLES = 200, 100
NOMINAL = bootstrap.DEFAULT_LEVEL
BAND = 2.2 * math.sqrt(NOMINAL * (1 - NOMINAL) / STUDIES)  # about 0.047


@pytest.mark.slow("200 synthetic studies x 100 bootstrap replicates (about 13 s)")
def test_intervals_over_seeds_then_problems_cover_at_their_nominal_rate():
  rate = calibration.coverage(calibration.Model(), studies=STUDIES, resamples=RESAMPLES)
  assert NOMINAL - BAND <= rate <= NOMINAL + BAND, rate


@pytest.mark.slow("200 synthetic studies x 100 replicates (about 18 s)")
def test_without_the_seed_correction_three_seeds_undercover():
  """A plain draw of 3 seeds keeps 2/3 of their variance: its 90% interval is about
  0.82 of the width it needs (theory: about 82% coverage)."""
  rate = calibration.coverage(calibration.Model(), studies=STUDIES, resamples=RESAMPLES,
                              plain=True)
  assert rate < NOMINAL - BAND, rate


def test_one_seed_per_allocation_cannot_cover_run_to_run_variance():
  """Why such a row is indicative: with seed variance as large as the effect, an
  interval over problems alone covers the true slope far less often than 90%."""
  rate = calibration.coverage(calibration.Model(seeds=1), studies=STUDIES,
                              resamples=RESAMPLES)
  assert rate < 0.6, rate


@pytest.mark.slow("150 studies of 3 sweeps x 100 replicates (about 29 s)")
def test_a_null_family_errs_at_most_at_the_nominal_family_wise_rate():
  """Three primary tests, none with an effect: Holm keeps the chance of any yes or no at
  or below 10% (the raw p-values would err in about 1 - 0.9^3 = 27% of studies)."""
  null = [calibration.Model(slope=0.0)] * 3
  adjusted, raw = calibration.family_error(null, studies=150, resamples=RESAMPLES)
  assert adjusted <= 1 - NOMINAL + 2.2 * math.sqrt(0.09 / 150), adjusted
  assert raw > adjusted


def test_a_planted_slope_is_found_after_the_family_adjustment():
  assert calibration.power(calibration.Model(slope=0.02), studies=60,
                           resamples=RESAMPLES) >= 0.8


# --- Each claim's statistic on planted effects and nulls --------------------------------


def _run(n, values_E, c_E, path=None):
  return records.RunCurve(path or f"n{n}", 8, n, np.asarray(c_E, float),
                          np.asarray(values_E, float))


def test_claim_1_finds_a_planted_rise_and_none_in_a_null():
  """Planted: small n wins early, large n late (known sigmoids). Null: every n on one
  curve, so n* at both points is the whole grid's centre and the rise is 0."""
  c_E = np.geomspace(64.0, 65536.0, 12)
  sig = lambda a, c_mid: 0.1 + (a - 0.1) / (1 + (c_mid / c_E) ** 1.5)
  grid = (2, 4, 8, 16)
  planted = [_run(n, sig(0.3 + 0.08 * math.log2(n), 200.0 * n), c_E) for n in grid]
  got = n_star.frontier_stats(planted, metrics.val_avg(4))

  def true_centre(c):  # the rule on the true curves, by hand
    v = {n: 0.1 + (0.2 + 0.08 * math.log2(n)) / (1 + (200.0 * n / c) ** 1.5) for n in grid}
    return np.mean([math.log2(n) for n in grid if v[n] >= max(v.values()) - 0.02])
  c_end = c_E[-1]
  want = true_centre(c_end) - true_centre(c_end / 16)
  assert want >= 1.0 and got["n_star_rise"] == pytest.approx(want, abs=0.5)
  null = [_run(n, sig(0.5, 2000.0), c_E) for n in (2, 4, 8, 16)]
  got = n_star.frontier_stats(null, metrics.val_avg(4))
  assert got["n_star_rise"] == 0.0 and got["log2_n_star_end"] == 2.5
  assert got["n_star_censored"] == 1.0  # the largest n ties: saturation not observed


def test_the_frontier_model_has_the_n_star_it_claims():
  """`true_rise` against a brute-force n* on a fine grid of the model's own curves:
  n* is the centre of the n within the margin of the best mean value."""
  m = calibration.FrontierModel()
  c_E = m.compute_E

  def centre(c):
    v = {n: m.r0 + (m.asymptote + m.gain_per_doubling * math.log2(n) - m.r0)
         / (1 + (m.c_mid * n ** m.delay_exponent / c) ** m.b) for n in m.rollouts_per_problem}
    return np.mean([math.log2(n) for n, x in v.items() if x >= max(v.values()) - 0.02])
  want = centre(c_E[-1]) - centre(max(c_E[-1] / 16, c_E[1]))
  assert calibration.true_rise(m) == pytest.approx(want) and want > 1.0
  null = calibration.FrontierModel(gain_per_doubling=0.0, delay_exponent=0.0)
  assert calibration.true_rise(null) == 0.0


@pytest.mark.slow("2 x 30 synthetic sweeps x 30 replicates of 6 sigmoid fits (about 40 s)")
def test_claim_1_interval_covers_a_known_rise_and_a_null_rarely_decides():
  """Claim 1 through the study's code on sweeps with a known n*(C): the interval holds
  the true rise at least at its nominal rate (it is discrete and conservative), and a
  null (every n on one curve) gives a yes or a no in at most about 10% of studies."""
  small = dict(problems_per_batch=(8,), gain_stops_at=3.0)
  planted = calibration.frontier_rates(calibration.FrontierModel(**small), studies=30,
                                       resamples=30)
  assert planted.truth == 2.0 and planted.undefined == 0.0
  assert planted.coverage >= NOMINAL - 2.2 * math.sqrt(0.09 / 30), planted
  null = calibration.frontier_rates(
      calibration.FrontierModel(gain_per_doubling=0.0, delay_exponent=0.0, **small),
      studies=30, resamples=30)
  assert null.truth == 0.0
  assert null.decided <= 1 - NOMINAL + 2.2 * math.sqrt(0.09 / 30), null


def test_claim_5_counts_problems_once_solved_and_lost_and_finds_a_planted_trend():
  """Per-problem counts where runs with larger n lose fewer of the problems they
  once solved: the slope of the lost fraction on log2 n is the planted one."""
  rng = np.random.default_rng(0)
  problems, evals = 4000, 4
  curves, truth = [], {}
  for n in (2, 4, 8, 16):
    lose = 0.4 - 0.08 * math.log2(n)     # the fraction of solved problems lost late
    solved_EG = np.ones((evals, problems), bool)
    lost_G = rng.random(problems) < lose
    solved_EG[2:, lost_G] = False        # lost at the last two evaluations
    counts_EG = np.where(solved_EG, 3, 0)
    values_EG = bootstrap.lost_problems(counts_EG)
    truth[n] = lost_G.mean()
    curves.append(bootstrap.ProblemCurve(f"n{n}", 8, n, 0, np.arange(evals, dtype=float),
                                         values_EG).curve())
  got = experiments.final_slope_log2_n(curves)
  want = np.polyfit(np.log2(list(truth)), list(truth.values()), 1)[0]
  assert got == pytest.approx(want) and got == pytest.approx(-0.08, abs=0.02)


@pytest.mark.parametrize("rise", [0.0, 2.0])
def test_claim_5_has_no_slope_on_a_null_whose_runs_evaluate_different_numbers_of_times(rise):
  """The SmolLM2 study's schedule (C = 2,048, B_p = 8, step 0 and 8 log-spaced steps:
  9 distinct evaluations at n = 2, 7 at n = 32) on a null: every n has the same
  per-problem pass rates at the same compute, constant or rising to 1 + rise times
  the base's. The lost fraction's slope on log2 n is 0 within its noise. On the
  constant null, counting problems solved at any earlier evaluation (brute force here)
  gives the runs with more evaluations more lost problems: a slope on the paper's side."""
  rng = np.random.default_rng(5)
  problems, samples, ns = 20000, 4, (2, 4, 8, 16, 32)
  p_G = rng.beta(0.3, 6.0, problems)         # pass rates of a hard split, mean about 0.05
  curves, any_earlier = [], []
  for n in ns:
    num_steps = 2048 // (8 * n)
    steps_E = np.array(sorted(EvalSettings(schedule="log", count=8).steps(num_steps)))
    frac_E = steps_E / num_steps
    counts_EG = rng.binomial(samples, np.minimum(1.0, p_G * (1 + rise * frac_E[:, None])))
    curves.append(bootstrap.ProblemCurve(f"n{n}", 8, n, 0, 8.0 * n * steps_E,
                                         bootstrap.lost_problems(counts_EG)).curve())
    any_earlier.append(np.mean((counts_EG[:-1] > 0).any(axis=0) & (counts_EG[-1] == 0)))
  assert [len(c.rollouts_E) for c in curves] == [9, 9, 9, 8, 7]
  got = experiments.final_slope_log2_n(curves)
  final = np.mean([experiments.final_value(c) for c in curves])
  se = math.sqrt(final * (1 - final) / problems) / math.sqrt(10)   # sum of (x - mean)^2
  assert abs(got) < 4 * se, (got, se)
  if rise == 0.0:
    assert np.polyfit(np.log2(ns), any_earlier, 1)[0] < -4 * se


def test_claim_6_is_unbiased_on_flat_noisy_curves_where_max_minus_final_is_not():
  """13 evaluations at SE 0.012 with no trend: the late fall averages 0 over many
  curves, max - final averages well above it (the statistic claim 6 used to use)."""
  rng = np.random.default_rng(1)
  c_E = np.geomspace(1.0, 4096.0, 13)
  falls, drops = [], []
  for _ in range(2000):
    c = _run(4, 0.4 + rng.normal(0, 0.012, 13), c_E)
    falls.append(experiments.late_fall(c))
    drops.append(float(c.values_E.max()) - experiments.final_value(c))
  assert abs(np.mean(falls)) < 3 * np.std(falls) / math.sqrt(len(falls))
  assert np.mean(drops) > 0.01


def test_claim_9_is_judged_out_of_sample_and_against_persistence():
  """A run still rising after its first half: the early fit predicts its end, while
  carrying the first half's last value forward misses the rise."""
  from isojax.planner import sigmoid_fit
  c_E = np.linspace(0.0, 2e5, 25)
  r_E = sigmoid_fit.sigmoid(c_E, 0.1, 0.7, 1.3, 6e4)
  check = sigmoid_fit.extrapolation_check(c_E, r_E, r0=0.1, lower=0, upper=1, tail=2)
  assert min(check["observed_rollouts"]) > 1e5
  assert abs(check["error"]) < 0.01 < abs(check["persistence_error"])


@pytest.mark.slow("60 synthetic studies x 400 bootstrap replicates (about 17 s)")
def test_the_power_calculation_agrees_with_the_simulated_power():
  """slope_power's normal approximation against `power`'s simulation of the study's
  bootstrap, for the model's design: run SD = sqrt(seed_sd^2 + the evaluation noise of
  a final value, the mean of two evaluations over the problems) is what a pilot's
  seed-to-seed SD measures."""
  m = calibration.Model(slope=0.008)
  run_sd = math.sqrt(m.seed_sd ** 2 + m.eval_sd ** 2 / (2 * m.problems))
  predicted = calibration.slope_power(m.slope, run_sd, m.rollouts_per_problem, seeds=m.seeds)
  # Replicates enough that the p-value's floor, 2 / (Z + 1), sits well below Holm's
  # 0.10 / 3: the approximation has no floor (at 100, only k = 0 could pass).
  simulated = calibration.power(m, studies=60, resamples=400)
  assert abs(predicted - simulated) < 0.2, (predicted, simulated)
  assert 0.2 < predicted < 0.95  # a design where the answer is not trivially 0 or 1
  # More seeds, more power; a null has power at most alpha.
  assert calibration.slope_power(0.008, run_sd, m.rollouts_per_problem, seeds=6) > predicted
  assert calibration.slope_power(0.0, run_sd, m.rollouts_per_problem) <= 0.1 / 3 + 1e-12


def _sigmoid(m, n, c):
  a = m.asymptote + m.gain_per_doubling * min(math.log2(n), m.gain_stops_at)
  return m.r0 + (a - m.r0) / (1 + (m.c_mid * n ** m.delay_exponent / c) ** m.b)


def test_the_time_to_value_model_has_the_saving_it_claims():
  """`true_log2_ratio` against the rule computed directly on the model's sigmoids: the
  target is the best uniform allocation's value at its last evaluation; each arm reaches
  it at its first evaluation (after the base) at or above it."""
  for speedup in (2.0, 1.5, 1.0):
    model = calibration.TimeToValueModel(speedup=speedup)
    m, c_E = model.frontier, model.frontier.compute_E[1:]
    ns = m.rollouts_per_problem
    target = max(_sigmoid(m, n, c_E[-1]) for n in ns)

    def first(s):
      return min(c for n in ns for c in c_E if _sigmoid(m, n, s * c) >= target)
    want = math.log2(first(speedup) / first(1.0))
    assert calibration.true_log2_ratio(model) == pytest.approx(want)
  assert calibration.true_log2_ratio(calibration.TimeToValueModel(speedup=2.0)) == -1.0
  assert calibration.true_log2_ratio(calibration.TimeToValueModel(speedup=1.0)) == 0.0


def test_claim_10_interval_covers_a_planted_saving_and_a_null_rarely_decides():
  """Claim 10 through the study's code on per_problem sweeps with a known saving: the
  90% interval holds the truth at about its nominal rate, and a null (both arms on one
  curve) gives a yes or a no in at most about 10% of studies."""
  bound = 2.2 * math.sqrt(0.09 / 40)
  planted = calibration.time_to_value_rates(calibration.TimeToValueModel(speedup=2.0),
                                            studies=40, resamples=60)
  assert planted.truth == -1.0 and planted.coverage >= NOMINAL - bound, planted
  null = calibration.time_to_value_rates(calibration.TimeToValueModel(speedup=1.0),
                                         studies=40, resamples=60, seed=1)
  assert null.truth == 0.0 and null.decided <= 1 - NOMINAL + bound, null
