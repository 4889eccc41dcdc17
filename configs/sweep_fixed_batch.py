r"""Fixed batch (paper finding 3): B = B_p * n = 256 fixed, n from 2 to 64, M = 64.

  python -m launch.sweep --config=configs/sweep_fixed_batch.py --out=/tmp/isojax/fixed_batch

With the batch fixed by the hardware, how should it be split between problems and
rollouts as the number of updates M grows? Every (B_p, n) with B_p * n = 256 (B_p from
128 down to 4) runs M = 64 updates (C = 16,384 rollouts) on the hard split. Since B is
the same for every run, each run's evaluations trace its whole M curve, so the
frontier over these 6 runs is n*(M) (the analysis's `fixed_batch` frontier, in units of
M = C / B), and B_p*(M) = B / n*(M). The experiment bootstraps how many doublings n*
rises from the first to the last M.

Presets: default, micro (the micro model on generated problems, B = 16).
"""

from isojax.configs import sweep_hard


def get_config(arg=None):
  c = sweep_hard.sweep_config(
      "fixed_batch", "configs/hard.py", split="hard", difficulty="hard", kind="fixed_batch",
      batch_rollouts=256, budget_rollouts=256 * 64,   # M = 64 updates
      problems_range=(4, 128), rollouts_range=(2, 64), max_batch_rollouts=256)
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _micro(c):
  c.batch_rollouts = c.max_batch_rollouts = 16
  c.budget_rollouts = 16 * 8
  c.problems_range = (2, 8)
  return c
