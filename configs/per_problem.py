r"""Per-problem rollout allocation: each problem's share of the step's B_p * n rollouts
chosen from its estimated pass rate, on a mix of easy and hard additions.

  python -m isojax.main --config=configs/per_problem.py --workdir=/tmp/isojax/per_problem
  # the uniform baseline at the same budget (n = 8 for every problem):
  python -m isojax.main --config=configs/per_problem.py:uniform --workdir=/tmp/isojax/uniform

The hard recipe on 2- and 3-digit additions (the tiny base solves most 2-digit sums
and few 3-digit ones, so pass rates spread from 0 to 1). A step samples 16 problems and
spends 16 x 8 = 128 rollouts on them: at least 2 and at most 32 for one problem, split to
maximise the expected number of groups with both a right and a wrong answer, the groups
GRPO learns from (`isojax.rl.rollout_allocation`). A problem's pass rate is estimated
from its own rollouts so far under a Beta prior (mean 0.5, 2 pseudo-rollouts); 128
training problems, so each is seen every 8 steps. `train/group_sizes` logs each
step's split and `train/zero_variance_fraction` the groups with no signal.

Presets: default, micro (a smoke test), and `uniform` after either (`micro,uniform`):
the same run with n = 8 for every problem.
"""

from isojax.config import config_lib


def get_config(arg=None):
  preset, _, variant = (arg or "").partition(",")
  if preset == "uniform":
    preset, variant = variant, preset
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.update(min_digits=2, max_digits=3, num_train=128)
  config.rollouts_per_problem = 8
  config.problems_per_batch = 16
  config.num_steps = 100
  # allocation_n_max 0: 4 n (32 here), so a plan at another n keeps the same bounds.
  config.rl.update(allocation="per_problem", allocation_n_min=2, allocation_n_max=0)
  config = config_lib.apply_preset(config, preset or None)
  if variant == "uniform":
    config.rl.allocation = "uniform"
  elif variant:
    raise ValueError(f"configs/per_problem.py: unknown variant {variant!r}; expected "
                     "'uniform'")
  return config
