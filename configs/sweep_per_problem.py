r"""Per-problem rollout allocation swept like any allocation: the iso-compute sweep of a
mix of hard and easy problems, each (B_p, n) run twice, uniform and per-problem.

  python -m launch.profile --config=configs/hard.py --splits=mix_hard_easy
  python -m launch.sweep --config=configs/sweep_per_problem.py --out=/tmp/isojax/per_problem
  python -m launch.study --sweeps=configs/sweep_per_problem.py --out=/tmp/isojax/study

B_p = 16, n in {4, ..., 64} at C = 16,384 rollouts on the `mix_hard_easy` split (half
avg@16 in [0, 0.0625], half in [0.3, 0.6]: a batch holds both kinds, where splitting
the rollouts by problem can matter). Variants:
  uniform      n rollouts for every problem
  per_problem  each step's 16 n rollouts split by the problems' estimated pass rates
               (`rl.allocation=per_problem`, 2 to 4 n for one problem; the profile's
               avg@16 is each problem's prior)
The experiment (kind `per_problem`, `isojax.planner.time_to_value`) bootstraps log2 of
the compute per-problem allocation needs to reach the uniform frontier's best final
value over the uniform allocations' own; the findings table gives it as claim 10.
Presets: default, micro.
"""

import ml_collections

from isojax.configs import sweep_hard


def _micro(c):
  c.rollouts_range = (4, 8)
  return c


def get_config(arg=None):
  c = sweep_hard.sweep_config("per_problem", "configs/hard.py", split="mix_hard_easy",
                              kind="per_problem", problems_range=(16, 16),
                              rollouts_range=(4, 64))
  c.variants = ml_collections.ConfigDict(dict(
      uniform=dict(overrides=dict(rl=dict(allocation="uniform"))),
      per_problem=dict(overrides=dict(rl=dict(allocation="per_problem"))),
  ))
  return sweep_hard.with_preset(c, arg, micro=_micro)
