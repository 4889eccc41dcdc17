r"""The easy-set recipe: k3 KL to the base model plus an entropy bonus, sqrt LR, T = 0.6.

  python -m isojax.main --config=configs/easy.py --workdir=/tmp/isojax/easy
  python -m isojax.main --config=configs/easy.py:micro --workdir=/tmp/isojax/micro
  python -m isojax.main --config=configs/easy.py:paper --workdir=... \
      --config.base_model.path=/ckpt/Qwen2.5-7B-Instruct

Presets: `default` (tiny model on a laptop CPU: 2-digit additions, whose base pass
rates spread over [0, 1]), `micro` (a smoke test), `paper` (the 7B settings).
"""

from isojax.config import config_lib
from isojax.configs import hard


def get_config(arg=None):
  """configs/hard.py's allocation with the easy recipe on 2-digit additions."""
  config = config_lib.apply_recipe(hard.get_config(), "easy")
  config.task.min_digits = config.task.max_digits = 2
  return config_lib.apply_preset(config, arg)
