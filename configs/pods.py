r"""PODS: generate n = 16 rollouts per problem, train on the m = 4 of maximum reward variance.

  python -m isojax.main --config=configs/pods.py --workdir=/tmp/isojax/pods
  # the matched vanilla GRPO baseline (n = m = 4):
  python -m isojax.main --config=configs/pods.py:grpo --workdir=/tmp/isojax/pods_grpo

Otherwise the hard recipe on the hard default task (configs/hard.py). Advantages are
computed on the selected subset (PODS default); `--config.rl.advantages_on=generated`
takes the baseline from all n rollouts instead (the decoupled-baseline ablation).
The LR follows the *trained* batch B_p * m under the square-root rule.
"""

from isojax.configs import hard


def get_config(arg=None):
  preset, _, variant = (arg or "").partition(",")
  if preset in ("grpo", "pods"):
    preset, variant = variant, preset
  config = hard.get_config(preset or None)
  if variant == "grpo":
    config.rollouts_per_problem = 4
    return config
  config.rollouts_per_problem = 16 if preset != "micro" else 4
  config.rl.update(downsample="max_variance",
                   train_rollouts_per_problem=4 if preset != "micro" else 2)
  return config
