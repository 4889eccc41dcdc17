r"""LoRA on the hard recipe: rank-8 adapters on every projection, the base frozen.

  python -m isojax.main --config=configs/lora.py --workdir=/tmp/isojax/lora
  python -m isojax.main --config=configs/lora.py:paper --workdir=gs://... \
      --config.base_model.path=/ckpt/Qwen2.5-7B-Instruct

Only the adapters train and sit in Adam; the reference policy is the frozen base; the
checkpoints hold the adapters. LoRA wants a larger learning rate than full training:
1e-3 at B_ref = 128 rollouts here (the hard recipe trains every weight at 1e-4).
"""

from isojax.config import config_lib
from isojax.configs import hard


def get_config(arg=None):
  config = hard.get_config()
  config.model.lora.update(rank=8, alpha=16.0)
  config.optim.learning_rate = 1e-3
  if arg == "paper":
    # The paper preset trains at 1e-6 at B_ref = 1024; LoRA at ten times that.
    config = config_lib.apply_preset(config, "paper")
    config.optim.learning_rate = 1e-5
    return config
  return config_lib.apply_preset(config, arg)
