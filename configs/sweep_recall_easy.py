r"""The iso-compute sweep on the recall task's easy keys: n from 2 to 64, B_p in {8, 16}.

  python -m launch.sweep --config=configs/sweep_recall_easy.py --out=/tmp/isojax/recall_easy

configs/sweep_recall_hard.py's grid on levels 1 and 2: 128 keys the base answers right
with probability 1/2 or 1/4. The paper's easy band is avg@16 in [0.3, 0.6]; level 2
(0.25) sits just below it, so the set is twice as large as level 1 alone. Like the hard
sweep it uses the hard recipe, so the two differ only in the keys and the budget.

The budget is C = 4,096 rollouts, 32 per key, where the runs are still learning (M >= 16
updates keep n <= 32 at B_p = 8 and n <= 16 at B_p = 16: 9 runs). The `long` preset
sweeps the same keys at C = 16,384, 128 per key, where the smaller n saturate: 12 runs
with n up to 64, as the sweep `recall_easy_long`. (At 65,536 every allocation ends at
avg@4 = 1 and the final values compare nothing.)

`constant_lr` and `long_constant_lr` are the learning-rate control of
configs/sweep_recall_hard.py on each (sweeps `recall_easy_constant_lr` and
`recall_easy_long_constant_lr`).

Presets: default, long, constant_lr, long_constant_lr, micro (3 runs of 16 keys at
C = 64: a smoke test).
"""

from isojax.configs import sweep_recall_hard


def get_config(arg=None):
  if arg in ("long", "long_" + sweep_recall_hard.CONSTANT_LR):
    return sweep_recall_hard.recall_sweep("recall_easy_long", sweep_recall_hard.EASY_LEVELS,
                                          "easy", arg[len("long_"):] or None, budget=16384)
  return sweep_recall_hard.recall_sweep("recall_easy", sweep_recall_hard.EASY_LEVELS, "easy",
                                        arg, budget=4096)
