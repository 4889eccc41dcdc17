"""A run with per-problem allocation: each step's split recomputed independently from the
pass history the checkpoint holds, and the budget kept."""

import importlib

import numpy as np
import orbax.checkpoint as ocp
import pytest

from isojax import run_dir
from isojax.rl import sources
from isojax.run import train


def _pass_history(workdir, step):
  """(successes, attempts) of every training problem in checkpoint `step`."""
  ckpt = ocp.CheckpointManager(workdir / "checkpoints")
  tree = ckpt.restore(step, args=ocp.args.Composite(counters=ocp.args.JsonRestore())).counters
  ckpt.close()
  return np.asarray(tree["pool"]["successes"]), np.asarray(tree["pool"]["attempts"])


def _objective(p, n):
  return sum(1 - pi ** ni - (1 - pi) ** ni for pi, ni in zip(p, n))


def _best_splits(p, budget, n_min, n_max):
  """Every split of `budget` among the problems within the bounds that maximises the
  expected number of mixed groups (brute force)."""
  splits = [np.array(n) for n in np.ndindex(*(n_max + 1,) * len(p))
            if sum(n) == budget and min(n) >= n_min]
  values = [_objective(p, n) for n in splits]
  return [s for s, v in zip(splits, values) if v >= max(values) - 1e-12]


@pytest.mark.slow("a 3-step run of the micro config")
@pytest.mark.parametrize("pods,aggregation", [(False, "token_mean"), (True, "token_mean"),
                                              (False, "prompt_mean")])
def test_each_steps_split_is_the_optimum_for_the_history_before_it(tmp_path, pods,
                                                                   aggregation):
  """With PODS (m = n = 4) too: a group above 4 is down-sampled to 4 and one below trains
  on all it has, so an uneven split pads the update's batch; the split still counts
  every generated rollout in the history. With prompt-level aggregation each problem's
  rows weigh as one prompt, whatever its group's size."""
  config = importlib.import_module("isojax.configs.per_problem").get_config("micro")
  config.rl.aggregation = aggregation
  if pods:
    config.rl.update(downsample="max_variance", train_rollouts_per_problem=4)
  config.num_steps, config.checkpoint_every, config.checkpoint_keep = 3, 1, 3
  config.rl.allocation_n_max = 8  # 4 problems x 4 rollouts: splits of 16 in [2, 8]
  config.task.num_train = 4  # every step the same 4 problems: their history decides
  workdir = tmp_path / "run"
  train.run(config, str(workdir))
  logged = [r for r in run_dir.read_metrics(str(workdir)) if r["step"] > 0]
  assert [r["rollouts"] for r in logged] == [16, 32, 48]
  n, b_p, prior, uneven, padded = 4, 4, 0.5, False, False
  for step, record in enumerate(logged):
    sizes = np.asarray(record["train/group_sizes"])
    chosen = sources.problems_for_step(config.seed, step, config.task.num_train, b_p)
    if step == 0:  # nothing seen yet: every estimate is the prior, an even split
      p = np.full(b_p, prior)
    else:  # the Beta posterior mean of the history after the steps before
      successes, attempts = _pass_history(workdir, step)
      p = (prior * 2.0 + successes[chosen]) / (2.0 + attempts[chosen])
    assert sizes.sum() == b_p * n and sizes.min() >= 2 and sizes.max() <= 8
    assert any(np.array_equal(sizes, best) for best in _best_splits(p, b_p * n, 2, 8)), (
        step, sizes, p)
    uneven = uneven or len(set(sizes.tolist())) > 1
    padded = padded or sizes.min() < 4
  assert uneven  # the history moved rollouts between problems
  assert padded or not pods  # a group below m: PODS's batch was padded
  # The history holds every rollout of the run: 48 attempts in all.
  assert _pass_history(workdir, 3)[1].sum() == 48


@pytest.mark.slow("a 3-step run of the micro config")
def test_dynamic_sampling_with_unequal_groups_keeps_the_budget(tmp_path):
  """Per-problem allocation with dynamic sampling: every round samples B_p * n = 16
  rollouts split among its problems; the step trains on the groups that fit those 16
  (informative ones first), in two minibatches of rollouts, and the compute counted is
  every round's."""
  config = importlib.import_module("isojax.configs.per_problem").get_config("micro")
  config.num_steps = 3
  config.rl.update(dynamic_sampling=True, dynamic_sampling_max_rounds=3, allocation_n_max=8,
                   num_minibatches=2)  # minibatches of rollouts: unequal groups split
  workdir = tmp_path / "run"
  train.run(config, str(workdir))
  logged = [r for r in run_dir.read_metrics(str(workdir)) if r["step"] > 0]
  total, rounds_seen = 0, []
  for record in logged:
    rounds = record["train/sampling_rounds"]
    rounds_seen.append(rounds)
    total += rounds * 16
    assert record["train/generated_rollouts"] == rounds * 16 and record["rollouts"] == total
    sizes = np.asarray(record["train/group_sizes"])
    assert sizes.sum() <= 16 and len(sizes) <= 4
    assert sizes.min() >= 2 and sizes.max() <= 8
    assert np.isfinite(record["train/loss"])
  assert max(rounds_seen) > 1  # the run drew further rounds
