"""Experiment analyses on synthetic runs with known ground truth."""

import json
import math
import os

import numpy as np
import pytest

from isojax import metrics
from isojax import run_dir
from isojax.config import config_lib
from isojax.planner import analysis
from isojax.planner import bootstrap
from isojax.planner import experiments
from isojax.planner import n_star
from isojax.planner import prescribe
from isojax.planner import records
from isojax.planner import synthetic

NUM_SAMPLES = 8


def _write_run(path, *, b_p, n, steps_T, p_T, rng, seed=0, num_problems=512,
               max_train=0, train_reward_T=None):
  """A run whose pass rate at each evaluation is p_T (every problem alike)."""
  config = config_lib.base_config()
  config.problems_per_batch, config.rollouts_per_problem = b_p, n
  config.num_steps, config.seed = int(steps_T[-1]), seed
  config.eval.num_samples = NUM_SAMPLES
  config.task.max_train_problems = max_train
  run_dir.write_config(path, config.to_dict())
  writer = run_dir.MetricsWriter(path)
  for t, (step, p) in enumerate(zip(steps_T, p_T)):
    counts = rng.binomial(NUM_SAMPLES, p, num_problems)
    line = {run_dir.STEP: int(step), run_dir.ROLLOUTS: int(step) * b_p * n,
            run_dir.TOKENS: 0, run_dir.WALL_S: 0.0,
            **metrics.summarize_correct(counts, NUM_SAMPLES, 4),
            metrics.VAL_CORRECT_COUNTS: counts.tolist()}
    if train_reward_T is not None:
      line[metrics.TRAIN_REWARD] = float(train_reward_T[t])
    writer.write(line)


def _log_steps(m, count=12):
  return np.unique(np.concatenate([[0], np.round(np.geomspace(1, m, count))]).astype(int))


def _true_centre(curves, compute, margin=0.02):
  """log2 n* of the true curves by claim 1's rule: the mean log2 n of the n within
  `margin` of the best value at `compute` (each n's best B_p)."""
  best = {}
  for tc in curves:
    v = float(tc(np.array([compute]))[0])
    best[tc.rollouts_per_problem] = max(best.get(tc.rollouts_per_problem, -1.0), v)
  top = max(best.values())
  return float(np.mean([math.log2(n) for n, v in best.items() if v >= top - margin]))


def test_fixed_batch_recovers_n_star_of_m(tmp_path):
  """B = 256 fixed: small n wins early, n = 32 late. The fitted frontier's n* at claim
  1's two points (C_end / 16 and C_end) equal the true curves' there."""
  batch, steps = 256, 64
  curves = [synthetic.TrueCurve(batch // n, n, r0=0.1, a=0.4 + 0.1 * math.log2(min(n, 32)),
                                b=1.5, c_mid=100.0 * n) for n in (2, 4, 8, 16, 32, 64)]
  synthetic.write_sweep(str(tmp_path), curves, num_steps=steps, num_evals=14,
                        log_spaced=True, num_problems=512, seed=3)
  result = experiments.analyze_experiment(str(tmp_path), "fixed_batch", num_resamples=60)
  c_end = batch * float(steps)
  c_start = c_end / 2 ** n_star.CLAIM1_SPAN_DOUBLINGS
  true_start, true_end = _true_centre(curves, c_start), _true_centre(curves, c_end)
  assert true_end - true_start >= 2  # the ground truth rises
  e = result["effects"]
  assert e["log2_n_star_start"]["value"] == pytest.approx(true_start, abs=0.5)
  assert e["log2_n_star_end"]["value"] == pytest.approx(true_end, abs=0.5)
  assert e["n_star_rise"]["lo"] <= true_end - true_start <= e["n_star_rise"]["hi"]
  assert e["n_star_rise"]["lo"] > 0
  # n = 32 leads n = 64 by 0.09 at the end: n* lies inside the grid, not censored.
  assert e["n_star_censored"]["value"] == 0.0
  # The frontier fitted on the first half of the compute predicts the best final value.
  frontier = result["frontier_extrapolation"][""]
  assert frontier["predicted_rollouts_per_problem"] == 32
  assert abs(frontier["error"]) < 0.02


def _bp_sweep(root, asymptotes, rng):
  for b_p, a in asymptotes.items():
    m = 16384 // (b_p * 8)
    steps_T = _log_steps(m)
    tc = synthetic.TrueCurve(b_p, 8, r0=0.2, a=a, b=1.5, c_mid=1500.0)
    _write_run(os.path.join(root, f"bp{b_p}"), b_p=b_p, n=8, steps_T=steps_T,
               p_T=tc(steps_T * b_p * 8), rng=rng)


def _true_final(a, b_p):
  steps_T = _log_steps(16384 // (b_p * 8))
  tc = synthetic.TrueCurve(b_p, 8, r0=0.2, a=a, b=1.5, c_mid=1500.0)
  return float(tc(steps_T[-1:] * b_p * 8)[0])  # a final value: the last evaluation


def test_problems_per_batch_spread_covers_the_true_spread(tmp_path):
  rng = np.random.default_rng(0)
  asymptotes = {4: 0.5, 8: 0.55, 16: 0.6, 32: 0.65}
  _bp_sweep(str(tmp_path), asymptotes, rng)
  result = experiments.analyze_experiment(str(tmp_path), "problems_per_batch",
                                          num_resamples=2000)  # enough for a 99.9% tail
  finals = [_true_final(a, b) for b, a in asymptotes.items()]
  truth = max(finals) - min(finals)
  e = result["effects"]["spread"]
  assert truth > 0.1
  # 99.9%: a 3.3-sd miss is luck; a wrong final (tail, metric) misses by far more.
  lo, hi = bootstrap.interval(e["samples"], 0.999)
  assert lo <= truth <= hi
  assert result["effects"]["slope_log2_bp"]["lo"] > 0


def test_problems_per_batch_no_effect_is_within_the_margin(tmp_path):
  rng = np.random.default_rng(1)
  _bp_sweep(str(tmp_path), {4: 0.6, 8: 0.6, 16: 0.6, 32: 0.6}, rng)
  e = experiments.analyze_experiment(str(tmp_path), "problems_per_batch",
                                     num_resamples=100)["effects"]["spread"]
  truth = max(_true_final(0.6, b) for b in (4, 8, 16, 32)) - min(
      _true_final(0.6, b) for b in (4, 8, 16, 32))
  assert truth < 0.01 and e["hi"] < 0.05  # margin_verdict says "barely matters"


def test_extrapolation_error_is_small_on_sigmoids_and_large_on_a_late_jump(tmp_path):
  rng = np.random.default_rng(2)
  steps_T = _log_steps(256, 14)
  tc = synthetic.TrueCurve(8, 4, r0=0.1, a=0.7, b=1.2, c_mid=2000.0)
  for seed in range(3):
    _write_run(str(tmp_path / f"sig{seed}"), b_p=8, n=4, steps_T=steps_T,
               p_T=tc(steps_T * 32), rng=rng, seed=seed, num_problems=2048)
  # Flat at 0.3 for the first half of the compute, then 0.6.
  jump_T = np.where(steps_T * 32 <= 0.5 * steps_T[-1] * 32, 0.3, 0.6)
  _write_run(str(tmp_path / "jump"), b_p=8, n=4, steps_T=steps_T, p_T=jump_T, rng=rng,
             seed=9, num_problems=2048)
  result = experiments.analyze_experiment(str(tmp_path), "iso_compute", num_resamples=10)
  errors = {os.path.basename(e["path"]): e for e in result["extrapolation"]}
  for seed in range(3):
    e = errors[f"sig{seed}"]
    true_end = float(tc(steps_T[-2:] * 32).mean())  # claim 9 averages the last two
    assert abs(e["predicted"] - true_end) < 0.02
    assert abs(e["error"]) < 0.02
  assert errors["jump"]["error"] < -0.2


def test_an_allocation_whose_seeds_differ_in_compute_is_named(tmp_path):
  """n = 4's two seeds were evaluated on different schedules (one was extended, say):
  the bootstrap cannot stack them for the seed correction, and the experiment names
  that allocation, and only it, for each metric."""
  rng = np.random.default_rng(4)
  for n, m, schedules in ((2, 64, (12, 12)), (4, 32, (12, 5))):
    for seed, count in enumerate(schedules):
      steps_T = _log_steps(m, count)
      _write_run(str(tmp_path / f"n{n}_s{seed}"), b_p=8, n=n, steps_T=steps_T,
                 p_T=0.2 + 0.3 * steps_T / m, rng=rng, seed=seed)
  result = experiments.analyze_experiment(str(tmp_path), "iso_compute", num_resamples=10)
  named = {(u["variant"], u["problems_per_batch"], u["rollouts_per_problem"])
           for u in result["uncorrected_seeds"]}
  assert named == {("", 8, 4)}
  assert {u["metric"] for u in result["uncorrected_seeds"]} >= {metrics.val_avg(4)}


def test_decoupled_effects_match_the_true_differences(tmp_path):
  rng = np.random.default_rng(3)
  finals = {"plain_train": 0.40, "decoupled": 0.45, "plain_estimate": 0.52}
  steps_T = _log_steps(128)
  for variant, final in finals.items():
    for seed in (0, 1):
      p_T = 0.2 + (final - 0.2) * steps_T / steps_T[-1]
      _write_run(str(tmp_path / variant / f"s{seed}"), b_p=16, n=4, steps_T=steps_T,
                 p_T=p_T, rng=rng, seed=seed)
  result = experiments.analyze_experiment(str(tmp_path), "decoupled_baseline",
                                          list(finals), num_resamples=100)
  e = result["effects"]
  # Each run ends at its `finals` value (its last evaluation, a final value).
  for key, truth in (("decoupled_minus_plain_train",
                      finals["decoupled"] - finals["plain_train"]),
                     ("plain_estimate_minus_decoupled",
                      finals["plain_estimate"] - finals["decoupled"])):
    lo, hi = bootstrap.interval(e[key]["samples"], 0.99)
    assert lo <= truth <= hi, key
    assert e[key]["lo"] > 0


def test_decoupled_needs_its_three_variants(tmp_path):
  with pytest.raises(analysis.AnalysisError, match="plain_train"):
    experiments.analyze_experiment(str(tmp_path), "decoupled_baseline", ["a", "b"])


def test_problem_set_size_sees_the_small_set_overfit(tmp_path):
  """The 16-problem variant peaks at 0.5 mid-run and ends at 0.3 while its train
  reward climbs; the full set rises to 0.5. The overfitting gap is the difference of
  their falls over the second half of compute: 0.2 - (-0.15) = 0.35."""
  rng = np.random.default_rng(4)
  steps_T = np.linspace(0, 256, 17).astype(int)  # linear: the fall spans many evaluations
  x_T = steps_T / steps_T[-1]
  # p16: rises to 0.5 at x = 0.5, then falls linearly to 0.3 at x = 1.
  p16_T = np.where(x_T <= 0.5, 0.2 + 0.6 * x_T, 0.5 - 0.4 * (x_T - 0.5))
  shapes = {"p16": (16, p16_T, np.linspace(0.1, 0.9, x_T.size)),
            "all": (0, 0.2 + 0.3 * x_T, np.linspace(0.1, 0.4, x_T.size))}
  for variant, (size, p_T, reward_T) in shapes.items():
    for n in (4, 8):
      _write_run(str(tmp_path / variant / f"n{n}"), b_p=16, n=n, steps_T=steps_T, p_T=p_T,
                 rng=rng, max_train=size, train_reward_T=reward_T)
  result = experiments.analyze_experiment(str(tmp_path), "problem_set_size", ["all", "p16"],
                                          num_resamples=100)
  assert result["details"]["sizes"] == {"all": None, "p16": 16}
  late = x_T >= 0.5
  fall = lambda p_T: -np.polyfit(x_T[late], p_T[late], 1)[0] * 0.5  # the true trend
  true_gap = fall(p16_T) - fall(0.2 + 0.3 * x_T)
  assert true_gap == pytest.approx(0.35)
  e = result["effects"]["overfit_gap"]
  assert e["lo"] > 0.1
  in_99 = lambda effect, x: (lambda lo, hi: lo <= x <= hi)(
      *bootstrap.interval(effect["samples"], 0.99))
  assert in_99(e, true_gap)
  own = result["effects"]["late_fall_smallest"]
  assert in_99(own, fall(p16_T)) and own["lo"] > 0
  change = result["details"]["train_reward_change"]
  assert change["p16"] > change["all"] > 0
  # Transfer: the validation problems are held out, so p16's gain on them is transfer.
  gain_16 = float(p16_T[-1] - p16_T[0])
  gain_all = float(0.2 + 0.3 * x_T[-1] - 0.2)
  for name, want in (("transfer_gain", gain_16), ("transfer_fraction", gain_16 / gain_all)):
    e = result["effects"][name]
    assert e["lo"] - 0.01 <= want <= e["hi"] + 0.01, (name, want, e)
  assert result["effects"]["transfer_gain"]["lo"] > 0


def _sigmoid_curve(n, a, c_mid, *, r0=0.2, b=2.0, c_end=65536.0):
  """A run's exact avg@k along a ScaleRL sigmoid of asymptote `a`."""
  c_E = np.linspace(0.0, c_end, 17)
  v_E = r0 + (a - r0) / (1 + (c_mid / np.maximum(c_E, 1e-9)) ** b)
  return records.RunCurve(f"n{n}", 16, n, c_E, v_E)


def test_final_values_compare_every_allocation_at_its_budget():
  """Every allocation's curve rises linearly in its fraction of C = 2,048 to the same 0.3
  at C, evaluated at step 0 and 8 log-spaced steps (the SmolLM2 study's schedule): n
  makes no difference at C, so the slope of the final values on log2 n is 0. A mean of
  each run's last two evaluations finds a rise: M = 8's second-to-last evaluation lies
  at 75% of its compute, M = 128's at 50%."""
  b_p, log2_n = 8, np.arange(1, 6)
  curves = []
  for n in 2 ** log2_n:
    m = 2048 // (b_p * int(n))
    steps_E = _log_steps(m, count=8).astype(float)
    curves.append(records.RunCurve(f"n{n}", b_p, int(n), steps_E * b_p * n,
                                   0.1 + 0.2 * steps_E / m))
  assert experiments.final_slope_log2_n(curves) == pytest.approx(0.0, abs=1e-12)
  last_two = [c.values_E[-2:].mean() for c in curves]
  assert np.polyfit(log2_n, last_two, 1)[0] > 0.005


def test_saturation_is_the_headroom_to_each_runs_asymptote_and_their_spread():
  """One n still far below its ceiling at the budget, one at it; then two ceilings."""
  rising, flat = _sigmoid_curve(4, 0.6, c_mid=60000.0), _sigmoid_curve(8, 0.6, c_mid=3000.0)
  got = experiments.saturation_stats([rising, flat], metrics.val_avg(4))
  want = np.mean([0.6 - c.values_E[-1] for c in (rising, flat)])
  assert got["headroom"] == pytest.approx(want, abs=2e-3) and want > 0.05
  assert got["asymptote_spread"] == pytest.approx(0.0, abs=2e-3)
  apart = [_sigmoid_curve(4, 0.5, c_mid=3000.0), _sigmoid_curve(8, 0.8, c_mid=3000.0),
           _sigmoid_curve(8, 0.7, c_mid=3000.0)]
  got = experiments.saturation_stats(apart, metrics.val_avg(4))
  assert got["asymptote_spread"] == pytest.approx(0.75 - 0.5, abs=2e-3)  # n=8: mean 0.75
  assert got["headroom"] == pytest.approx(0.0, abs=2e-3)


def test_sweep_analysis_writes_variant_analyses_experiment_and_findings(tmp_path):
  """A variant sweep (the algorithms kind) of synthetic runs through launch's analysis:
  per-variant analysis.json, experiment.json equal to the library's answer, the plot,
  and a findings row per variant from `launch.findings`."""
  import json
  import subprocess
  import sys
  import zlib

  from isojax.sweeps import sweep_analysis

  from isojax.sweeps import sweep_config

  true_best = {}
  for variant, sat, c_mid in (("cispo", 16, 164.0), ("pods", 4, 410.0), ("ppo", 8, 250.0)):
    curves = synthetic.paper_like_curves((16,), (2, 4, 8, 16, 32), n_saturation=sat,
                                         c_mid_base=c_mid)
    synthetic.write_sweep(str(tmp_path / "algorithms" / "runs" / variant), curves,
                          budget_rollouts=16384, num_evals=12, log_spaced=True,
                          num_problems=1024, seed=len(variant))
    true_best[variant] = _true_centre(curves, 16384.0)
  sweep = sweep_config.load_config_file("configs/sweep_algorithms.py:micro")
  sweep.bootstrap_resamples = 30
  summary = sweep_analysis.analyze(str(tmp_path / "algorithms"), sweep)
  for variant in ("cispo", "pods", "ppo"):
    assert (tmp_path / "algorithms" / variant / "analysis.json").is_file()
    assert (tmp_path / "algorithms" / variant / "worst@4" / "analysis.json").is_file()
  written = json.loads((tmp_path / "algorithms" / "experiment.json").read_text())
  # Replicates seeded by the sweep's name, so two sweeps (claim 2c's hard and easy) draw
  # independently: the same draws as the library's under that seed, not under seed 0.
  direct = experiments.analyze_experiment(str(tmp_path / "algorithms" / "runs"), "algorithms",
                                          ["cispo", "pods", "ppo"], num_resamples=30,
                                          seed=zlib.crc32(sweep.name.encode()))
  assert {k: e["value"] for k, e in written["effects"].items()} == pytest.approx(
      {k: e["value"] for k, e in direct["effects"].items()}, nan_ok=True)
  key = "avg_slope_log2_n_cispo"
  assert written["effects"][key]["samples"] == pytest.approx(direct["effects"][key]["samples"])
  assert (tmp_path / "algorithms" / "experiment.png").stat().st_size > 10_000
  # n* saturates at 16 (cispo), 4 (pods), 8 (ppo): n* at the end is the true curves'
  # (near-ties within the margin: pods's 4 and 8 end within 0.02 of each other), up to
  # a neighbour whose true gap to the best is near the margin (ppo's 16: 0.025), which
  # moves the centre by half a doubling.
  assert true_best == {"cispo": 4.0, "pods": 2.5, "ppo": 3.0}
  for variant, want in true_best.items():
    got = written["effects"][f"log2_n_star_end_{variant}"]["value"]
    assert abs(got - want) <= 0.5, (variant, got)
  assert "n_star_rise_cispo" in sweep_analysis.format_analysis(summary)
  out = subprocess.run([sys.executable, "-m", "launch.findings", f"--study={tmp_path}"],
                       capture_output=True, text=True, check=True).stdout
  assert "| 8 | the n*(C) trend holds with other RL algorithms | algorithms/cispo |" in out
  assert "| 8 | the n*(C) trend holds with other RL algorithms | algorithms/pods |" in out
  assert "| 8 | the n*(C) trend holds with other RL algorithms | algorithms/ppo |" in out


def test_n_star_is_undefined_when_no_allocation_rises(tmp_path):
  """Curves that go up and back down within noise: every fit is flat, every n ties at
  its first value, and n* has no value rather than the smallest n's."""
  c_E = np.linspace(0.0, 1024.0, 5)
  bumps = [records.RunCurve(f"n{n}", 8, n, c_E, np.array([0.1, 0.12, 0.2, 0.11, 0.1]) + d)
           for n, d in ((2, 0.0), (4, 0.01), (8, -0.01))]
  got = n_star.frontier_stats(bumps, metrics.val_avg(4))
  assert all(math.isnan(v) for v in got.values()), got
  # Nor has the fitted law, so `launch.plan --analysis=` prescribes nothing from it.
  flat = analysis.analyze_metric(bumps, metrics.val_avg(4),
                                 analysis.Options(metric=metrics.val_avg(4)))
  assert all(cf.fit.flat for cf in flat.curve_fits) and len(flat.frontier) > 2
  assert flat.law is None and flat.by_problems_per_batch[8]["law"] is None
  path = os.path.join(tmp_path, "analysis.json")
  with open(path, "w") as f:
    json.dump(flat.to_dict(), f)
  with pytest.raises(ValueError, match="no allocation's fit rose above a flat line"):
    prescribe.load_law(path)
  rising = [_sigmoid_curve(n, 0.3 + 0.1 * i, c_mid=3000.0) for i, n in enumerate((2, 4, 8))]
  got = n_star.frontier_stats(rising, metrics.val_avg(4))
  assert got["log2_n_star_end"] == 3.0  # the highest ceiling's n wins at the end
  assert analysis.analyze_metric(rising, metrics.val_avg(4), analysis.Options(
      metric=metrics.val_avg(4))).law is not None
