r"""The iso-compute sweep on the recall task's hard keys: n from 2 to 64, B_p in {8, 16}.

  python -m launch.sweep --config=configs/sweep_recall_hard.py --out=/tmp/isojax/recall_hard
  python -m launch.study --profile_config= --out=/tmp/isojax/recall_study \
      --sweeps=configs/sweep_recall_easy.py,configs/sweep_recall_hard.py

The grid, evaluation schedule and analysis of configs/sweep_hard.py, on configs/recall.py
restricted to levels 4 to 8: 320 keys whose base pass rates 1/16 to 1/256 are the paper's
hard band (avg@16 <= 0.0625), set by construction, so no profiling is needed. Evaluation
is on those 320 training keys (docs/study.md says why). The budget is C = 65,536
rollouts: about 200 per key, enough for a key at 1/256 to be solved at least once with
probability 1 - (1 - 1/256)^200 = 0.54.

The learning-rate control: the hard recipe scales the peak LR with the square root of
the trained batch (`optim.lr_scaling='sqrt'`), and each key has its own head row, where
Adam's step is about the LR whatever the gradient's size. At fixed C that rule alone
moves a rare key further at large n (more, larger steps on it) and an easy key less, the
pattern coverage predicts. The `constant_lr` preset runs the same grid with the LR at
its reference value for every batch (`lr_scaling='constant'`), as the sweep
`recall_hard_constant_lr`: a claim that survives it is not the LR rule's.

Presets: default, constant_lr, micro (3 runs of 16 keys at C = 64: a smoke test).
"""

import ml_collections

from isojax.configs import sweep_hard

HARD_LEVELS = (4, 8)
EASY_LEVELS = (1, 2)
KEYS_PER_LEVEL = 64  # configs/recall.py's task (the shipped base's)


CONSTANT_LR = "constant_lr"  # the preset (and the sweep-name suffix) of the LR control
# The recall study's six sweeps hold 12 primary rows; the smallest bootstrap p-value,
# 2 / (Z + 1), passes Holm's 0.10 / 12 only from Z = 240
# (`bootstrap.resamples_to_decide(12)`); 500 leave room for an effect near the edge.
BOOTSTRAP_RESAMPLES = 500


def recall_sweep(name: str, levels: tuple[int, int], difficulty: str, arg,
                 budget: int = 65536):
  """The sweep `name` on `levels`; preset `arg` is default, micro or constant_lr."""
  constant = arg == CONSTANT_LR
  c = sweep_hard.sweep_config(f"{name}_{CONSTANT_LR}" if constant else name,
                              "configs/recall.py", split="", difficulty=difficulty,
                              budget_rollouts=budget)
  c.bootstrap_resamples = BOOTSTRAP_RESAMPLES
  keys = KEYS_PER_LEVEL * (levels[1] - levels[0] + 1)
  c.overrides.task.update(recall_min_level=levels[0], recall_max_level=levels[1],
                          num_train=keys, num_val=keys)
  if constant:
    c.overrides.optim = ml_collections.ConfigDict(dict(lr_scaling="constant"))
    return c
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _micro(c):
  c.base_config = "configs/recall.py:micro"
  c.overrides.task.update(num_train=16, num_val=16)
  return c


def get_config(arg=None):
  return recall_sweep("recall_hard", HARD_LEVELS, "hard", arg)
