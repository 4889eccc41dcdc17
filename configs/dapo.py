r"""DAPO (Yu et al. 2025) on the tiny default: the hard recipe with DAPO's four changes.

  python -m isojax.main --config=configs/dapo.py --workdir=/tmp/isojax/dapo

Clip-higher (ratio clipped to [1 - 0.2, 1 + 0.28]), token-level loss averaging, soft
overlong shaping over the last 2 of the 8 new tokens, and dynamic sampling: further
rounds of 16 problems until 16 groups have reward variance (at most 4 rounds; every
sampled rollout counts in `rollouts`). No KL or entropy terms, as in DAPO. 3-digit
additions, n = 16, B_p = 16, M = 200. Presets as in hard.py.
"""

from isojax.config import config_lib


def get_config(arg=None):
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.min_digits = config.task.max_digits = 3
  config.rollouts_per_problem = 16
  config.problems_per_batch = 16
  config.num_steps = 200
  config.rl.update(policy_loss="dapo", clip_eps=0.2, clip_eps_high=0.28,
                   aggregation="token_mean", overlong="dapo", overlong_cache_tokens=2,
                   dynamic_sampling=True, dynamic_sampling_max_rounds=4)
  return config_lib.apply_preset(config, arg)
