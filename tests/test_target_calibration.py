"""The testbeds' time-to-target ratio on synthetic seeds with known truths: the model's
truth by hand, a noiseless saving found exactly, and the error rate of the verdict when nothing differs."""

import numpy as np
import pytest

from isojax.tools import target_calibration, time_to_target


@pytest.mark.parametrize("speedup,expected", [(1.0, 1.0), (2.0, 0.5), (1.25, 0.8),
                                              (3.0, 0.4)])
def test_the_truth_is_the_saving_rounded_up_to_the_next_evaluation(speedup, expected):
  """Evaluations every tenth of the budget: C / speedup rounded up to a tenth."""
  assert target_calibration.truth(target_calibration.TargetModel(speedup=speedup)) == \
      pytest.approx(expected)
  assert target_calibration.truth(target_calibration.TargetModel(speedup=speedup,
                                                                 gain=0.0)) == 1.0


def test_without_noise_a_planted_saving_is_found_exactly():
  model = target_calibration.TargetModel(speedup=2.0, seed_sd=0.0, eval_sd=0.0)
  r = target_calibration.rates(model, studies=5, level=0.9)
  assert (r.truth, r.mean_estimate, r.coverage, r.yes, r.no, r.undefined) == \
      pytest.approx((0.5, 0.5, 1.0, 1.0, 0.0, 0.0))


def test_with_nothing_to_find_the_verdict_errs_near_its_nominal_rate():
  """No saving, a rising curve, five seeds: at 96.7% a yes or a no in at most 6% of 400
  testbeds (nominal 3.3%, three binomial SEs above it)."""
  level = 1 - 0.10 / 3
  r = target_calibration.rates(target_calibration.TargetModel(), studies=400, level=level)
  assert r.undefined == 0.0
  assert r.yes + r.no <= 0.06, r


def test_a_baseline_that_peaks_at_its_start_is_refused_naming_the_seed():
  start = {"step": 0, "rollouts": 0.0, "tokens": 0, "wall_s": 0.0}
  rows = [dict(seed=7, baseline=start, candidate=start, candidate_end=start)]
  with pytest.raises(ValueError, match="seed 7: the baseline's peak is its first"):
    time_to_target.ratio_effect(rows, "rollouts")


def test_seeds_that_all_reach_the_target_together_show_no_saving():
  """Every seed's ratio exactly 1 (an interval of one point at 1) is no evidence of less
  compute: inconclusive, where a non-strict bound said yes (11.7% of null testbeds at
  SmolLM2's design of 3 seeds and 5 evaluations)."""
  point = lambda rollouts: {"step": 1, "rollouts": rollouts, "tokens": 0, "wall_s": 1.0}
  rows = [dict(seed=s, baseline=point(100.0), candidate=point(100.0)) for s in range(3)]
  effect = time_to_target.ratio_effect(rows, "rollouts")
  assert (effect["lo"], effect["value"], effect["hi"]) == (1.0, 1.0, 1.0)
  assert time_to_target.speedup_verdict(effect, 1.0) == "inconclusive"


def test_a_candidate_at_the_target_from_its_start_is_refused_naming_the_seed():
  start = {"step": 0, "rollouts": 0.0, "tokens": 0, "wall_s": 0.0}
  later = dict(start, step=3, rollouts=300.0)
  rows = [dict(seed=4, baseline=later, candidate=start, candidate_end=later)]
  with pytest.raises(ValueError, match="seed 4: the candidate reached the target at its"):
    time_to_target.ratio_effect(rows, "rollouts")
