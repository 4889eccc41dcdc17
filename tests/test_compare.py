"""isojax.tools.time_to_target (behind launch.compare): time to reach the baseline's peak."""

import numpy as np
import pytest

from isojax.tools import time_to_target


def _lines(values, per_step=8):
  return [dict(step=s, rollouts=s * per_step, tokens=s * 40, wall_s=s * 0.5,
               **({"val/avg@4": v} if v is not None else {})) for s, v in enumerate(values)]


def test_candidate_reaching_the_peak_earlier():
  base = _lines([0.1, 0.2, None, 0.35, 0.3])
  cand = _lines([0.1, 0.36, 0.2], per_step=32)
  out = time_to_target.compare(base, cand, "val/avg@4")
  assert out["target"] == 0.35
  assert out["baseline"] == dict(step=3, rollouts=24, tokens=120, wall_s=1.5)
  assert out["candidate"] == dict(step=1, rollouts=32, tokens=40, wall_s=0.5)
  assert out["candidate_best"] == 0.36


def test_candidate_that_never_reaches_it():
  out = time_to_target.compare(_lines([0.1, 0.5]), _lines([0.1, 0.4]), "val/avg@4")
  assert out["candidate"] is None and out["candidate_best"] == 0.4


def test_baseline_without_the_metric():
  with pytest.raises(ValueError, match="val/avg@4"):
    time_to_target.compare(_lines([None, None]), _lines([0.1]), "val/avg@4")


def _row(seed, base, cand, end=None):
  point = lambda rollouts, wall: {"step": 1, "rollouts": rollouts, "tokens": 0,
                                  "wall_s": wall}
  return dict(seed=seed, target=0.3, baseline=point(*base),
              candidate=None if cand is None else point(*cand),
              candidate_end=point(*(end or cand)), candidate_best=0.3,
              phase_s=dict(baseline_sample_s=1.0, baseline_update_s=0.5,
                           candidate_sample_s=3.0, candidate_update_s=0.4))


def test_ratio_over_seeds_is_a_geometric_mean_with_censored_seeds_as_lower_bounds():
  rows = [_row(0, (100, 10.0), (420, 12.0)), _row(1, (100, 10.0), None, end=(900, 30.0)),
          _row(2, (200, 20.0), (700, 21.0))]
  wall = time_to_target.ratio_effect(rows, "wall_s")
  assert wall["value"] == pytest.approx(np.exp(np.mean(np.log([1.2, 3.0, 1.05]))))
  assert wall["censored"] == [1] and wall["seeds"] == 3
  assert wall["lo"] <= wall["value"] <= wall["hi"]
  assert time_to_target.speedup_verdict(wall, 1.7) == "no"  # every seed slower, not 1.7x faster
  rollouts = time_to_target.ratio_effect(rows, "rollouts")
  assert rollouts["value"] == pytest.approx(np.exp(np.mean(np.log([4.2, 9.0, 3.5]))))
  fast = [_row(s, (100, 10.0), (100, w)) for s, w in enumerate((4.0, 5.0, 4.5))]
  assert time_to_target.speedup_verdict(time_to_target.ratio_effect(fast, "wall_s"), 1.7) == "yes"
  mixed = [_row(s, (100, 10.0), (100, w)) for s, w in enumerate((3.0, 12.0, 6.0))]
  assert time_to_target.speedup_verdict(time_to_target.ratio_effect(mixed, "wall_s"), 1.7) == "inconclusive"
  one = time_to_target.ratio_effect(fast[:1], "wall_s")
  assert time_to_target.speedup_verdict(one, 1.7) == "indicative"


def test_the_pods_verdict_row_names_the_regime():
  from isojax.reproduce import pods
  rows = [_row(0, (100, 10.0), (420, 12.0)), _row(1, (100, 10.0), (350, 11.0))]
  text = pods.verdict_table(rows)
  assert "**no**" in text and "GRPO samples 1.000 s, updates 0.500 s" in text
  assert "PODS samples 3.000 s, updates 0.400 s" in text


def test_the_per_problem_verdict_row_and_signal_shares():
  from isojax.reproduce import per_problem
  lines = [dict(step=s, **{"train/zero_variance_fraction": z})
           for s, z in enumerate((0.5, 0.25, 0.75))] + [dict(step=3)]
  assert per_problem.signal_share(lines) == pytest.approx(1 - 0.5)
  # Rollouts ratios 0.5, 0.6, 0.55: every seed cheaper, the interval below 1.
  rows = [dict(_row(s, (1000, 1.0), (r, 1.0)), signal=dict(baseline=0.4, candidate=0.7))
          for s, r in enumerate((500, 600, 550))]
  text = per_problem.verdict_row("arithmetic", rows, 0.95)
  value = np.exp(np.mean(np.log([0.5, 0.6, 0.55])))
  assert text.startswith("| arithmetic |") and f"{value:.2f}x" in text and "**yes**" in text
  assert "| 0.40, 0.40, 0.40 | 0.70, 0.70, 0.70 |" in text
  # A wider interval at the Bonferroni level than at 90%.
  wide = time_to_target.ratio_effect(rows, "rollouts", level=0.95)
  narrow = time_to_target.ratio_effect(rows, "rollouts")
  assert wide["lo"] <= narrow["lo"] and wide["hi"] >= narrow["hi"]
  assert f"[{wide['lo']:.2f}, {wide['hi']:.2f}]" in text


def test_the_smollm2_pilot_criterion_and_choice():
  from isojax.reproduce import smollm2_pilot
  lines = ([dict(step=0, **{"val/truncated_fraction": 0.02})]
           + [dict(step=s, **{"train/response_length": 10.0 + s}) for s in range(1, 21)]
           + [dict(step=20, **{"val/truncated_fraction": 0.08})])
  summary = dict(gain=0.09, gain_se=0.03)
  got = smollm2_pilot.criteria(summary, lines)
  # Lengths 11..30: the last 8 (23..30) average 26.5, over the first step's 11.
  assert got["gain_se"] == pytest.approx(3.0) and got["cut"] == 0.08
  assert got["growth"] == pytest.approx(26.5 / 11) and not got["passes"]  # grew 2.4x
  flat = [dict(line, **{"train/response_length": 10.0}) if "train/response_length" in line
          else line for line in lines]
  assert smollm2_pilot.criteria(summary, flat)["passes"]
  assert not smollm2_pilot.criteria(dict(gain=0.05, gain_se=0.03), flat)["passes"]  # 1.7 SE
  rates = {"lr1e-5": 1e-5, "lr2e-5": 2e-5}
  ok, bad = dict(passes=True), dict(passes=False)
  assert smollm2_pilot.chosen({"lr1e-5": [ok, ok], "lr2e-5": [ok, ok]}, rates) == "lr2e-5"
  assert smollm2_pilot.chosen({"lr1e-5": [ok, ok], "lr2e-5": [ok, bad]}, rates) == "lr1e-5"
  assert smollm2_pilot.chosen({"lr1e-5": [bad, ok], "lr2e-5": [ok, bad]}, rates) is None


def test_the_pilots_token_cap_rule():
  """The 99th percentile of the base's lengths, rounded up to a multiple of 32."""
  from isojax.reproduce import smollm2_pilot
  assert smollm2_pilot.cap_rule(np.arange(1, 101)) == 128  # p99 = 99.01
  assert smollm2_pilot.cap_rule(np.full(50, 12)) == 32
  assert smollm2_pilot.cap_rule(np.full(50, 64)) == 64


def test_the_pilots_seed_spread_and_the_study_size_it_gives():
  """Two candidates of two seeds: the pooled SD by hand, its chi-square bound with 2
  degrees of freedom, and the slope the study's design (n 2..32, 3 seeds, Holm over 4)
  detects with 80% power: (z_{1-0.0125} + z_{0.8}) sd / sqrt(3 * 10)."""
  from isojax.reproduce import smollm2_pilot
  finals = {"lr1e-5": [0.30, 0.36], "lr2e-5": [0.25, 0.29]}
  sd = np.sqrt((2 * 0.03 ** 2 + 2 * 0.02 ** 2) / 2)
  got_sd, got_hi, dof = smollm2_pilot.seed_spread(finals)
  assert dof == 2 and got_sd == pytest.approx(sd)
  assert got_hi == pytest.approx(sd * np.sqrt(2 / 0.210721), rel=1e-5)  # chi2_2(0.10)
  note = smollm2_pilot.spread_note(finals)
  assert f"{sd:.3f}" in note and "n in {2, 4, 8, 16, 32}, 3 seeds" in note
  assert f"{(2.2414027 + 0.8416212) * sd / np.sqrt(30):.3f} per doubling" in note
  flat = smollm2_pilot.spread_note({"lr1e-5": [0.3, 0.3], "lr2e-5": [0.25, 0.25]})
  assert "0.000" in flat and "says nothing of the study's size" in flat  # no division by 0
  with pytest.raises(ValueError, match="two or more seeds"):
    smollm2_pilot.seed_spread({"lr1e-5": [0.3]})
