r"""Problem-set size (paper finding 6): the same allocations on 16 / 64 / 256 / all
training problems of the hard split.

  python -m launch.sweep --config=configs/sweep_problem_set_size.py \
      --out=/tmp/isojax/problem_set_size

Saturation of n depends on the problem set: small sets overfit (train reward rises
while validation falls). Each variant trains on the first `task.max_train_problems`
problems of a fixed shuffle of the split (nested: the 16 are among the 64, ...), with
B_p = 16 and n in {4, 8, 16} at C = 16,384 rollouts (M = 256, 128, 64): with 16
problems every step sees the whole set. The experiment bootstraps each size's late-run drop
(best evaluation minus final) and their difference between the smallest and the full
set; the train-reward change per size is reported beside it. The paper's sizes
(64 / 256 / 1,024 / all) are scaled to the 512 training problems of the tiny split.

Presets: default, micro.
"""

import ml_collections

from isojax.configs import sweep_hard

SIZES = {"p16": 16, "p64": 64, "p256": 256, "all": 0}   # 0: every training problem


def get_config(arg=None):
  c = sweep_hard.sweep_config("problem_set_size", "configs/hard.py", split="hard",
                              difficulty="hard", kind="problem_set_size",
                              problems_range=(16, 16), rollouts_range=(4, 16))
  c.variants = _variants(SIZES)
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _variants(sizes: dict) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict({
      name: dict(overrides=dict(task=dict(max_train_problems=size)))
      for name, size in sizes.items()})


def _micro(c):
  c.rollouts_range = (2, 4)
  c.variants = _variants({"p4": 4, "all": 0})
  return c
