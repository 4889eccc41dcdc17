"""Bootstrap intervals over problems: per-problem values, coverage, pairing, verdicts."""

import math

import itertools

import numpy as np
import pytest

from isojax import metrics
from isojax import run_dir
from isojax.planner import bootstrap


def _comb_mean(counts, n, k, kind):
  out = []
  for c in counts:
    if kind == "best":
      out.append(1 - math.comb(n - c, k) / math.comb(n, k))
    else:
      out.append(math.comb(c, k) / math.comb(n, k))
  return np.array(out)


@pytest.mark.parametrize("kind", ["best", "worst"])
def test_per_problem_values_match_the_unbiased_estimators(kind):
  counts = np.arange(9)
  got = bootstrap.per_problem_values(f"val/{kind}@4", counts, 8)
  np.testing.assert_allclose(got, _comb_mean(counts, 8, 4, kind), atol=1e-12)
  np.testing.assert_allclose(bootstrap.per_problem_values("val/avg@4", counts, 8), counts / 8)


def test_lost_problems_are_those_solved_at_step_0_and_unsolved_now():
  counts_EG = np.array([[0, 2, 0, 3],
                        [1, 0, 0, 0],
                        [0, 0, 0, 4],
                        [0, 1, 0, 0]])
  # By hand: problem 0 unsolved at step 0, so never lost (solving it at e1 and losing
  # it again is not interference from where training began); problem 1 lost at e1, e2,
  # solved again at e3; problem 2 never solved; problem 3 lost at e1 and e3.
  want = np.array([[0, 0, 0, 0],
                   [0, 1, 0, 1],
                   [0, 1, 0, 0],
                   [0, 0, 0, 1]], float)
  np.testing.assert_array_equal(bootstrap.lost_problems(counts_EG), want)


def test_unknown_metric_is_an_error():
  with pytest.raises(ValueError, match="val/avg@k"):
    bootstrap.per_problem_values("train/reward", [1], 8)


def _curve(values_EG, n=4, b_p=8, seed=0, path="r"):
  t = values_EG.shape[0]
  return bootstrap.ProblemCurve(path=path, problems_per_batch=b_p, rollouts_per_problem=n,
                                seed=seed, rollouts_E=np.arange(t, dtype=float) * 100,
                                values_EG=values_EG)


def _final(groups):
  return {"final": float(groups["a"][0].values_E[-1])}


def test_interval_covers_a_known_mean_at_its_nominal_rate():
  """Problems with Beta(2, 3) pass rates (population mean 0.4), 8 samples each: the
  90% interval of the mean avg@k must cover 0.4 in about 90% of independent sets."""
  rng = np.random.default_rng(0)
  trials, covered = 150, 0
  for trial in range(trials):
    p_G = rng.beta(2, 3, 200)
    counts_G = rng.binomial(8, p_G)
    values_EG = bootstrap.per_problem_values("val/avg@4", counts_G, 8)[None, :]
    point, samples = bootstrap.bootstrap({"a": [_curve(values_EG)]}, _final,
                                         num_resamples=200, seed=trial)
    lo, hi = bootstrap.interval(samples["final"])
    covered += lo <= 0.4 <= hi
    assert lo <= point["final"] <= hi
  assert 0.82 <= covered / trials <= 0.97, covered / trials


def test_problem_draw_is_shared_by_every_run():
  """Two runs with the same per-problem values give identical replicates, so their
  difference has a zero-width interval (paired), while each alone varies."""
  rng = np.random.default_rng(1)
  values_EG = rng.random((3, 50))
  groups = {"a": [_curve(values_EG, path="x")], "b": [_curve(values_EG, n=8, path="y")]}

  def stat(g):
    return {"diff": g["a"][0].values_E[-1] - g["b"][0].values_E[-1],
            "a": g["a"][0].values_E[-1]}

  _, samples = bootstrap.bootstrap(groups, stat, num_resamples=50)
  np.testing.assert_allclose(samples["diff"], 0.0, atol=1e-12)
  assert samples["a"].std() > 0.01


def test_seeds_of_one_allocation_are_resampled_with_their_variance():
  """An allocation run with seeds whose values differ by a constant: replicates mix the
  seeds, so the seed mean varies even when every problem is identical, and its variance
  is the seeds' unbiased variance over k (a plain draw would give (k - 1) / k of it)."""
  for values in ([0.0, 1.0], [0.2, 0.5, 0.3]):
    runs = [_curve(np.full((2, 10), v), seed=s, path=f"s{s}") for s, v in enumerate(values)]

    def stat(g):
      return {"mean": float(np.mean([c.values_E[-1] for c in g["a"]]))}

    point, samples = bootstrap.bootstrap({"a": runs}, stat, num_resamples=4000)
    assert point["mean"] == pytest.approx(np.mean(values))
    want = np.var(values, ddof=1) / len(values)
    assert samples["mean"].var() == pytest.approx(want, rel=0.1)
    assert samples["mean"].mean() == pytest.approx(np.mean(values), abs=0.02)
  # Three seeds: each replicate's mean is a triple's mean moved out by sqrt(3 / 2).
  assert set(np.round(samples["mean"], 6)) <= set(np.round(
      np.mean(values) + np.sqrt(len(values) / (len(values) - 1)) * np.array(
          [np.mean(c) - np.mean(values) for c in itertools.product(values, repeat=3)]), 6))


def test_holm_adjusts_like_the_textbook_procedure():
  """Holm on four p-values, against the step-down rule written out by hand."""
  p = [0.01, 0.04, 0.03, 0.20]
  # sorted: 0.01 (x4), 0.03 (x3), 0.04 (x2), 0.20 (x1), each at least the one before
  want = [0.04, 0.09, 0.09, 0.20]
  np.testing.assert_allclose(bootstrap.holm(p), want)
  assert bootstrap.holm([0.5, float("nan")])[0] == 1.0  # NaN counts in the family
  assert np.isnan(bootstrap.holm([0.5, float("nan")])[1])


def test_p_value_matches_the_interval_it_goes_with():
  rng = np.random.default_rng(0)
  for shift in np.linspace(-0.3, 0.3, 13):
    samples = rng.normal(shift, 0.1, 400)
    lo, hi = bootstrap.interval(samples)
    p = bootstrap.p_value(samples)
    assert (p < 0.1) == (lo > 0 or hi < 0) or abs(p - 0.1) < 0.01, (shift, p, lo, hi)
  assert bootstrap.p_value(np.zeros(50)) == 1.0  # every replicate at 0: nothing excluded


def test_p_value_counts_one_more_on_each_side_and_is_never_zero():
  """2 (k + 1) / (Z + 1) by hand: 3 of 199 finite replicates below 0, NaNs left out."""
  samples = np.r_[np.full(196, 0.5), [-0.1, -0.2, 0.0], [np.nan, np.nan]]
  assert bootstrap.p_value(samples) == pytest.approx(2 * (3 + 1) / (199 + 1))
  assert bootstrap.p_value(np.ones(200)) == pytest.approx(2 / 201)


def test_resamples_to_decide_is_the_fewest_that_can_pass_holm():
  """With no replicate across 0, Z replicates give p = 2 / (Z + 1); Holm's strictest
  threshold for a family of m is alpha / m: brute force over Z."""
  for family in (1, 3, 4, 12):
    fewest = next(z for z in range(1, 10_000) if 2 / (z + 1) * family < 0.1)
    assert bootstrap.resamples_to_decide(family, 0.1) == fewest
    smallest_p = bootstrap.p_value(np.ones(fewest))
    assert bootstrap.holm([smallest_p] * family)[0] < 0.1
    assert bootstrap.holm([bootstrap.p_value(np.ones(fewest - 1))] * family)[0] >= 0.1
  assert bootstrap.p_verdict(0.2, 0.01) == "yes"
  assert bootstrap.p_verdict(-0.2, 0.01) == "no"
  assert bootstrap.p_verdict(-0.2, 0.01, expected=-1) == "yes"
  assert bootstrap.p_verdict(0.2, 0.2) == "inconclusive"


def test_problem_curve_reads_counts_and_rejects_runs_without_them(tmp_path):
  path = str(tmp_path / "run")
  run_dir.write_config(path, {"problems_per_batch": 4, "rollouts_per_problem": 2,
                              "seed": 3, "eval": {"num_samples": 8}})
  writer = run_dir.MetricsWriter(path)
  for step, extra in enumerate([{metrics.VAL_CORRECT_COUNTS: [0, 8, 4]}, {"train/reward": 0.5},
                                {metrics.VAL_CORRECT_COUNTS: [8, 8, 0]}]):
    writer.write({run_dir.STEP: step, run_dir.ROLLOUTS: 8 * step, run_dir.TOKENS: 0,
                  run_dir.WALL_S: 0.0, **extra})
  (run,) = [r for _, r in run_dir.iter_loaded_runs([path])]
  c = bootstrap.problem_curve(run, "val/avg@4")
  np.testing.assert_array_equal(c.rollouts_E, [0, 16])
  np.testing.assert_allclose(c.values_EG, [[0, 1, 0.5], [1, 1, 0]])
  assert c.seed == 3 and c.key == (4, 2)
  # Interference from the same counts: problem 2 was solved at step 0 and is lost at 2.
  lost = bootstrap.problem_curve(run, bootstrap.LOST)
  np.testing.assert_array_equal(lost.values_EG, [[0, 0, 0], [0, 0, 1]])
  with pytest.raises(run_dir.RunFormatError, match="per-problem counts"):
    bootstrap.problem_curve(run, "val/avg@4", counts_key=metrics.TRAIN_PASS1_COUNTS)


def test_interference_needs_the_step_0_counts(tmp_path):
  path = str(tmp_path / "run")
  run_dir.write_config(path, {"problems_per_batch": 4, "rollouts_per_problem": 2,
                              "eval": {"num_samples": 8}})
  writer = run_dir.MetricsWriter(path)
  for step in (1, 2):
    writer.write({run_dir.STEP: step, run_dir.ROLLOUTS: 8 * step, run_dir.TOKENS: 0,
                  run_dir.WALL_S: 0.0, metrics.VAL_CORRECT_COUNTS: [1, 0]})
  (run,) = [r for _, r in run_dir.iter_loaded_runs([path])]
  assert bootstrap.problem_curve(run, "val/avg@4").rollouts_E.tolist() == [8, 16]
  with pytest.raises(run_dir.RunFormatError, match="step-0 evaluation.*at 8 rollouts"):
    bootstrap.problem_curve(run, bootstrap.LOST)


@pytest.mark.parametrize("lo,hi,expected,verdict", [
    (0.1, 0.3, 1, "yes"), (-0.3, -0.1, 1, "no"), (0.0, 0.0, 1, "inconclusive"),
    (-0.3, 0.0, 1, "inconclusive"), (0.0, 0.2, 1, "inconclusive"),
    (-0.1, 0.2, 1, "inconclusive"), (-0.3, -0.1, -1, "yes"), (0.1, 0.2, -1, "no"),
    (float("nan"), 0.2, 1, "inconclusive")])
def test_sign_verdict(lo, hi, expected, verdict):
  assert bootstrap.sign_verdict({"lo": lo, "hi": hi}, expected=expected) == verdict


def test_an_interval_needs_half_of_the_replicates_to_have_a_value():
  mostly_undefined = [0.0] * 21 + [float("nan")] * 179  # 21 of 200 replicates
  e = bootstrap.effect(float("nan"), mostly_undefined)
  assert math.isnan(e["lo"]) and math.isnan(e["hi"]) and e["num_resamples"] == 21
  assert bootstrap.sign_verdict(e) == "inconclusive"
  mostly_defined = [0.1, 0.2, 0.3] * 40 + [float("nan")] * 80  # 120 of 200
  e = bootstrap.effect(0.2, mostly_defined)
  assert 0.1 <= e["lo"] < e["hi"] <= 0.3 and bootstrap.sign_verdict(e) == "yes"


@pytest.mark.parametrize("lo,hi,verdict", [
    (0.0, 0.04, "yes"), (0.06, 0.1, "no"), (0.02, 0.08, "inconclusive")])
def test_margin_verdict(lo, hi, verdict):
  assert bootstrap.margin_verdict({"lo": lo, "hi": hi}, 0.05) == verdict


@pytest.mark.parametrize("second_at", [16.0, 32.0])
def test_seeds_at_different_compute_are_drawn_plainly_and_said_so(second_at, caplog):
  """Two seeds, final values 1 and 0 on every problem. Evaluated at the same compute,
  a replicate moves them sqrt(2) from their mean (0.5 +- 0.707: outside [0, 1]); at
  different compute they cannot be stacked, so a replicate draws them as they are
  (means 0, 0.5 or 1), with a warning that the interval under-covers."""
  runs = [bootstrap.ProblemCurve("a", 8, 2, 0, np.array([0.0, 16.0]), np.ones((2, 3))),
          bootstrap.ProblemCurve("b", 8, 2, 1, np.array([0.0, second_at]), np.zeros((2, 3)))]
  final = lambda g: dict(final=float(np.mean([c.values_E[-1] for c in g["x"]])))
  with caplog.at_level("WARNING"):
    _, samples = bootstrap.bootstrap({"x": runs}, final, num_resamples=200)
  got = set(np.round(samples["final"], 6))
  uncorrected = bootstrap.uncorrected_allocations({"x": runs, "one": runs[:1]})
  assert uncorrected == ([] if second_at == 16.0 else [("x", (8, 2))])
  if second_at == 16.0:
    assert got == {0.5, round(0.5 + math.sqrt(2) / 2, 6), round(0.5 - math.sqrt(2) / 2, 6)}
    assert "different compute" not in caplog.text
  else:
    assert got == {0.0, 0.5, 1.0}
    assert "(B_p, n) = (8, 2): its 2 seeds were evaluated at different compute" in caplog.text
