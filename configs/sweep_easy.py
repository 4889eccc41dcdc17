r"""The iso-compute sweep on the easy split: n from 2 to 64, B_p in {8, 16}.

  python -m launch.profile --config=configs/hard.py          # writes the `easy` split
  python -m launch.sweep --config=configs/sweep_easy.py --out=/tmp/isojax/sweep_easy

The same grid, budget (C = 16,384 rollouts, 12 runs) and evaluation schedule as
configs/sweep_hard.py (whose docstring describes a run's cost), with the easy recipe
(configs/easy.py: k3 KL to the base model and an entropy bonus) on the profiled `easy`
split (avg@16 in [0.3, 0.6]). The KL term scores every batch under the base model too;
the hard recipe already does so to log train/kl, so a run costs the same.

Presets: default, micro (3 runs of the micro model on generated problems).
"""

from isojax.configs import sweep_hard


def get_config(arg=None):
  return sweep_hard.with_preset(sweep_hard.sweep_config("easy", "configs/easy.py", split="easy",
                                                        difficulty="easy"), arg)
