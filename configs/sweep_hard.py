r"""The iso-compute sweep on the hard split: n from 2 to 64, B_p in {8, 16}.

  python -m launch.profile --config=configs/hard.py          # writes the `hard` split
  python -m launch.sweep --config=configs/sweep_hard.py --out=/tmp/isojax/sweep_hard
  python -m launch.sweep --config=configs/sweep_hard.py:micro --out=/tmp/sweep_micro

Every allocation (B_p, n, M) of powers of two with B_p in [8, 16], n in [2, 64],
B = B_p * n <= 1024 and M = C / B >= 16 spends the budget C = 16,384 rollouts: 12 runs
of the hard recipe (configs/hard.py) on the profiled `hard` split (avg@16 <= 0.0625).
Each run evaluates at step 0 and 12 log-spaced steps (eval_schedule='log': more
decades of compute per evaluation) and checkpoints every M // 12 steps; the analysis
fits val/avg@4, val/best@4 and val/worst@4, and the experiment (kind iso_compute)
bootstraps n*'s rise, the best@4 / worst@4 slopes in log2 n and the interference
statistic over the validation (and histogram training) problems.

Cost (tiny default model): a run pays its start-up (imports, model load; the
persistent compilation cache in DIR/jax_cache serves the shapes runs share), sampling
and training in proportion to its C = 16,384 rollouts, and 13 evaluations. The manifest
(sweep.json) records each run's wall time; docs/results/study.md has a study's wall time.

This module also holds the fields every sweep config shares (`sweep_config`); the
other experiments (configs/sweep_*.py) start from it. The optional fields it leaves
out (kind, variants, seeds, eval_schedule, ...) take the defaults of
`isojax.sweeps.sweep_config.OPTIONAL`, the one place they are defined.

Presets: default (above), micro (3 runs of the micro model on generated problems; a
smoke test of the launcher).
"""

import ml_collections


def sweep_config(name: str, base_config: str, split: str, difficulty: str = "",
                 **fields) -> ml_collections.ConfigDict:
  """The sweep fields every shipped sweep shares, then `fields` (kind, ranges, ...) set
  over them."""
  c = ml_collections.ConfigDict()
  c.name = name
  c.base_config = base_config             # run config file[:preset] (`isojax.configs.find`)
  # Run-config fields set in every run (nested like the run config).
  c.overrides = ml_collections.ConfigDict(dict(
      task=ml_collections.ConfigDict(dict(split=split, splits_dir="~/.cache/isojax/splits")),
  ))
  c.budget_rollouts = 16384               # C; a list runs several budgets
  c.problems_range = (8, 16)              # B_p: powers of two in the range
  c.rollouts_range = (2, 64)              # n: powers of two in the range
  c.max_batch_rollouts = 1024             # B_max
  c.min_steps = 16                        # fewest updates M (above the 10 LR warm-up steps)
  c.evals_per_run = 12                    # evaluations per run; checkpoint_every = M // this
  c.difficulty = difficulty               # which claims it tests: easy | hard
  c.analysis = ml_collections.ConfigDict(dict(
      metrics=("val/avg@4", "val/best@4", "val/worst@4"),  # the first is the primary
      fit_min_rollouts=0.0,
      records=False,
  ))
  c.update(fields)
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
  c.eval_schedule = "linear"
  c.bootstrap_resamples = 20
  return c


def with_preset(c: ml_collections.ConfigDict, arg, micro=None) -> ml_collections.ConfigDict:
  """`c` for preset `arg`: default, or micro (`apply_micro`, then `micro(c)` if given)."""
  if arg == "micro":
    c = apply_micro(c)
    return micro(c) if micro else c
  if arg not in (None, "", "default"):
    raise ValueError(f"preset {arg!r}: expected default or micro")
  return c


def get_config(arg=None):
  return with_preset(sweep_config("hard", "configs/hard.py", split="hard", difficulty="hard"),
                     arg)
