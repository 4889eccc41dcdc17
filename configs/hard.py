r"""The hard-set recipe: no KL, no entropy bonus, square-root LR scaling, T = 0.6.

  python -m isojax.main --config=configs/hard.py --workdir=/tmp/isojax/hard
  python -m isojax.main --config=configs/hard.py:micro --workdir=/tmp/isojax/micro
  python -m isojax.main --config=configs/hard.py:paper --workdir=gs://... \
      --config.base_model.path=/ckpt/Qwen2.5-7B-Instruct

Presets: `default` (tiny model on a laptop CPU: 3-digit additions, whose base pass
rates are mostly below 0.2), `micro` (a quick smoke test), `paper` (the 7B settings of
the IsoCompute paper).
"""

from isojax.config import config_lib


def get_config(arg=None):
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.min_digits = config.task.max_digits = 3
  config.rollouts_per_problem = 16
  config.problems_per_batch = 16
  config.num_steps = 200
  return config_lib.apply_preset(config, arg)
