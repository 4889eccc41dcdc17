r"""PPO with a learned value function (GAE) on the tiny default.

  python -m isojax.main --config=configs/ppo.py --workdir=/tmp/isojax/ppo

The hard recipe with `rl.advantage=gae`: a critic initialised from the policy's
weights learns the value of every response token's state, GAE (gamma = lambda = 1)
gives per-token advantages, whitened per batch, and PPO-clip takes them. No group is
needed, so the 256 rollouts of a step cover 64 problems, 4 rollouts each. 3-digit
additions, M = 200. Presets as in hard.py.
"""

from isojax.config import config_lib


def get_config(arg=None):
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.min_digits = config.task.max_digits = 3
  config.rollouts_per_problem = 4
  config.problems_per_batch = 64
  config.num_steps = 200
  config.rl.update(advantage="gae", gamma=1.0, gae_lambda=1.0, policy_loss="ppo_clip")
  config.critic.update(learning_rate=1e-4, warmup_steps=0, value_clip=0.2)
  return config_lib.apply_preset(config, arg)
