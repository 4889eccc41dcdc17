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

Presets: default, micro (3 runs of 16 keys at C = 64: a smoke test).
"""

from isojax.configs import sweep_hard

HARD_LEVELS = (4, 8)
EASY_LEVELS = (1, 2)
KEYS_PER_LEVEL = 64  # configs/recall.py's task (the shipped base's)


def recall_sweep(name: str, levels: tuple[int, int], difficulty: str, arg,
                 budget: int = 65536):
  c = sweep_hard.sweep_config(name, "configs/recall.py", split="", difficulty=difficulty,
                              budget_rollouts=budget)
  keys = KEYS_PER_LEVEL * (levels[1] - levels[0] + 1)
  c.overrides.task.update(recall_min_level=levels[0], recall_max_level=levels[1],
                          num_train=keys, num_val=keys)
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _micro(c):
  c.base_config = "configs/recall.py:micro"
  c.overrides.task.update(num_train=16, num_val=16)
  return c


def get_config(arg=None):
  return recall_sweep("recall_hard", HARD_LEVELS, "hard", arg)
