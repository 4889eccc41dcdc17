r"""Algorithm robustness (paper RQ4): the iso-compute sweep of the hard split with CISPO,
with PODS and with PPO (a critic) instead of the PPO-clip GRPO of configs/sweep_hard.py.

  python -m launch.sweep --config=configs/sweep_algorithms.py --out=/tmp/isojax/algorithms

Does n*(C) keep its shape across RL algorithms? B_p = 16, n in {2, ..., 64} at
C = 16,384 rollouts (6 allocations, the B_p = 16 half of the hard sweep) per variant:

  cispo  rl.policy_loss = cispo (ScaleRL's loss: truncated IS weight times log-prob)
  pods   generate n, train on m = max(2, n / 4) chosen by max-variance down-sampling
         (n = 2: m = n, plain GRPO)
  ppo    rl.advantage = gae: per-token advantages from a learned value model (GAE,
         gamma = lambda = 1) instead of the group's rewards

The experiment bootstraps each variant's n* rise (doublings over the frontier), its
best@4 / worst@4 slopes and interference statistic; the findings table sets them
beside GRPO's from the hard sweep.

Presets: default, micro.
"""

import ml_collections

from isojax.configs import sweep_hard


def get_config(arg=None):
  c = sweep_hard.sweep_config("algorithms", "configs/hard.py", split="hard",
                              difficulty="hard", kind="algorithms", problems_range=(16, 16))
  c.variants = ml_collections.ConfigDict(dict(
      cispo=dict(overrides=dict(rl=dict(policy_loss="cispo"))),
      pods=dict(train_fraction=0.25, overrides=dict(rl=dict(downsample="max_variance"))),
      ppo=dict(overrides=dict(rl=dict(advantage="gae"))),
  ))
  return sweep_hard.with_preset(c, arg)
