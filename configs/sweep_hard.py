r"""The iso-compute sweep on the hard split: n from 2 to 128, B_p in {8, 16, 32}.

  python -m launch.profile --config=configs/hard.py          # writes the `hard` split
  python -m launch.sweep --config=configs/sweep_hard.py --out=/tmp/isojax/sweep_hard
  python -m launch.sweep --config=configs/sweep_hard.py:micro --out=/tmp/sweep_micro

Every allocation (B_p, n, M) of powers of two with B_p in [8, 32], n in [2, 128],
B = B_p * n <= 2048 and M = C / B >= 16 spends the budget C = 32,768 rollouts: 20 runs
of the hard recipe (configs/hard.py) on the profiled `hard` split (avg@16 <= 0.0625).
Each run evaluates and checkpoints every M // 16 steps, so each allocation has 16
points on its curve; the analysis fits val/avg@4, val/best@4 and val/worst@4.

Cost on the 2-core CPU development machine (tiny default model), measured per run with
`python -m isojax.main` on the plans this config writes (wall time, whole process):
  bp16_n16 (B = 256, M = 128)   52.7 s      bp16_n128 (B = 2048, M = 16)   58.9 s
  bp8_n2   (B = 16,  M = 2048)  66.3 s      easy recipe, bp16_n16          50.5 s
A run is ~6 s of start-up (imports, model load; the persistent compilation cache in
DIR/jax_cache serves the shapes runs share), ~45-55 s of sampling and training for
C = 32,768 rollouts (about 1.5 ms per rollout plus 0.01 s per step) and 17 evaluations
of ~0.3 s. One worker keeps ~1.65 cores busy; two single-threaded workers did the work
of two runs 1.27x faster than one after the other. So one sweep is 20 runs * ~60 s
~ 20 min with one worker, ~16 min with two; the study (profiling ~30 s, both sweeps,
the analyses ~1 min) ~35-45 min. Doubling the budget doubles the middle term
(~1.7x the total). The manifest (sweep.json) records each run's wall time.

Presets: default (above), micro (3 runs of the micro model on generated problems; a
smoke test of the launcher in about a minute).
"""

import ml_collections


def sweep_config(name: str, base_config: str, split: str) -> ml_collections.ConfigDict:
  """The sweep fields shared by the easy and the hard sweep."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.base_config = base_config             # run config file[:preset], repo-relative
  # Run-config fields set in every run (nested like the run config).
  c.overrides = ml_collections.ConfigDict(dict(
      task=ml_collections.ConfigDict(dict(split=split, splits_dir="~/.cache/isojax/splits")),
      base_model=ml_collections.ConfigDict(dict(cache_dir="~/.cache/isojax")),
  ))
  c.budget_rollouts = 32768               # C; a list runs several budgets
  c.problems_range = (8, 32)              # B_p: powers of two in the range
  c.rollouts_range = (2, 128)             # n: powers of two in the range
  c.max_batch_rollouts = 2048             # B_max
  c.min_steps = 16                        # fewest updates M (above the 10 LR warm-up steps)
  c.evals_per_run = 16                    # eval.every = checkpoint_every = M // this
  c.analysis = ml_collections.ConfigDict(dict(
      metrics=("val/avg@4", "val/best@4", "val/worst@4"),  # the first is the primary
      fit_min_rollouts=0.0,
      records=False,
  ))
  return c


def apply_micro(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """3 runs of the micro model on generated problems (no profiled split needed)."""
  c.base_config = c.base_config + ":micro"
  c.overrides.task.split = ""
  c.budget_rollouts = 64
  c.problems_range = (4, 4)
  c.rollouts_range = (2, 8)
  c.max_batch_rollouts = 32
  c.min_steps = 2
  c.evals_per_run = 4
  return c


def get_config(arg=None):
  c = sweep_config("hard", "configs/hard.py", split="hard")
  if arg == "micro":
    return apply_micro(c)
  if arg not in (None, "", "default"):
    raise ValueError(f"preset {arg!r}: expected default or micro")
  return c
