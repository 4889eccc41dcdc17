r"""B_p sensitivity (paper finding 4): n = 8 fixed, B_p from 4 to 128 at fixed C.

  python -m launch.sweep --config=configs/sweep_problems_per_batch.py \
      --out=/tmp/isojax/problems_per_batch

The paper finds that B_p barely matters within a moderate range (it is a stability
knob): set n from the law, keep B_p moderate, let M absorb the rest. Here n = 8 and
C = 16,384 rollouts on the easy split (the paper's setting for this finding), with
B_p in {4, ..., 128} (M from 512 down to 16): 6 runs. The experiment bootstraps the
spread (max - min) of the final avg@4 across B_p, its slope in log2 B_p, and the
late-run volatility (mean |change| between consecutive evaluations in the second half
of a run) at the smallest and the largest B_p.

Presets: default, micro.
"""

from isojax.configs import sweep_hard


def get_config(arg=None):
  c = sweep_hard.sweep_config("problems_per_batch", "configs/easy.py", split="easy",
                              difficulty="easy", kind="problems_per_batch",
                              problems_range=(4, 128), rollouts_range=(8, 8))
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _micro(c):
  c.problems_range = (2, 8)
  c.rollouts_range = (4, 4)
  c.budget_rollouts = 128
  return c
