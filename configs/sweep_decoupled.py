r"""Decoupled baseline (paper finding 7): estimate the GRPO baseline from n_est = 16
rollouts, train on n_train = 4 of them; against plain n = 4 and plain n = 16.

  python -m launch.sweep --config=configs/sweep_decoupled.py --out=/tmp/isojax/decoupled

The paper: a baseline from 256 rollouts with updates on 64 of them beats plain n = 64
but loses to plain n = 256. All three variants run B_p = 16 for M = 128 updates on the
hard split (the same number of updates on the same problems; the decoupled and the
plain n_est runs sample 4x the rollouts of plain n_train), two seeds each:

  plain_train     n = 4                                           (C = 8,192)
  plain_estimate  n = 16                                          (C = 32,768)
  decoupled       n = 16 sampled, 4 drawn at random for the update, advantages
                  from the mean and std of all 16 (rl.advantages_on = generated)

The experiment bootstraps the final avg@4 differences decoupled - plain_train and
plain_estimate - decoupled (validation problems and the two seeds resampled).

Presets: default, micro.
"""

import ml_collections

from isojax.configs import sweep_hard

N_TRAIN, N_ESTIMATE, STEPS, PROBLEMS = 4, 16, 128, 16


def variants(n_train: int, n_estimate: int, steps: int, problems: int) -> dict:
  def plain(n):
    return dict(rollouts_range=(n, n), budget_rollouts=problems * n * steps)
  return {
      "plain_train": plain(n_train),
      "plain_estimate": plain(n_estimate),
      "decoupled": dict(plain(n_estimate), overrides=dict(rl=dict(
          downsample="random", train_rollouts_per_problem=n_train,
          advantages_on="generated"))),
  }


def get_config(arg=None):
  c = sweep_hard.sweep_config("decoupled", "configs/hard.py", split="hard",
                              difficulty="hard", kind="decoupled_baseline",
                              problems_range=(PROBLEMS, PROBLEMS), seeds=(0, 1))
  c.variants = ml_collections.ConfigDict(variants(N_TRAIN, N_ESTIMATE, STEPS, PROBLEMS))
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _micro(c):
  c.problems_range = (4, 4)
  c.variants = ml_collections.ConfigDict(variants(2, 4, 4, 4))
  return c
