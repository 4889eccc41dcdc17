"""Sweep plans: the runs of a sweep config. `plan_runs` enumerates the planner's
iso-compute grid (`prescribe.sweep`, or one batch's) per budget, seed and variant and
resolves one run config per allocation (`prescribe.to_config`, checked by
`config_lib.resolve_dict`). `manifest.prepare` writes them; the backends run them:
locally (`isojax.sweeps.runner`) or through cluster scripts (`isojax.sweeps.cluster`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import ml_collections

from isojax.config import config_lib
from isojax.planner import grids, prescribe
from isojax.sweeps.sweep_config import (SweepError, base_run_config, check_sweep_config,
                                        variant_sweeps)
from isojax.tasks import splits


@dataclasses.dataclass(frozen=True)
class PlannedRun:
  name: str
  allocation: grids.Allocation
  config: dict[str, Any]          # the resolved run config, as written to plan.json


def budgets(sweep: ml_collections.ConfigDict) -> list[int]:
  value = sweep.budget_rollouts
  values = list(value) if isinstance(value, (list, tuple)) else [value]
  if not values or any(not isinstance(v, int) or v < 1 for v in values):
    raise SweepError(f"budget_rollouts={value!r}: expected a positive integer or a list")
  return sorted(set(values))


def run_name(allocation: grids.Allocation, with_steps: bool) -> str:
  a = allocation
  name = f"bp{a.problems_per_batch}_n{a.rollouts_per_problem}"
  return f"{name}_m{a.num_steps}" if with_steps else name


def _allocations(sweep: ml_collections.ConfigDict, base: ml_collections.ConfigDict,
                 budget: int) -> list[grids.Allocation]:
  """The grid of one budget: every iso-compute allocation, or those of one batch."""
  try:
    if sweep.batch_rollouts:
      return grids.fixed_batch_grid(sweep.batch_rollouts, [budget // sweep.batch_rollouts],
                                    tuple(sweep.problems_range), tuple(sweep.rollouts_range))
    return prescribe.sweep(
        budget, base, max_batch_rollouts=sweep.max_batch_rollouts,
        problems_range=tuple(sweep.problems_range),
        rollouts_range=tuple(sweep.rollouts_range), min_steps=sweep.min_steps, exact=True)
  except (grids.BudgetTooSmallError, ValueError) as e:
    raise SweepError(f"budget_rollouts={budget}: {e}") from e


def _run_config(sweep: ml_collections.ConfigDict, base: ml_collections.ConfigDict,
                allocation: grids.Allocation, seed: int | None) -> dict[str, Any]:
  """The resolved run config of one allocation (and seed) of a (variant) sweep."""
  config = ml_collections.ConfigDict(base.to_dict())
  every = max(1, allocation.num_steps // sweep.evals_per_run)
  config.eval.every = every
  config.eval.schedule = sweep.eval_schedule
  config.eval.count = sweep.evals_per_run
  config.checkpoint_every = every
  if seed is not None:
    config.seed = seed
  if sweep.train_fraction:
    n = allocation.rollouts_per_problem
    m = max(2, int(n * sweep.train_fraction))
    config.rl.train_rollouts_per_problem = m if m < n else 0  # m = n: nothing to drop
  try:
    return config_lib.resolve_dict(prescribe.to_config(allocation, config))
  except ValueError as e:
    raise SweepError(f"allocation {allocation.to_dict()}: {e}") from e


def plan_runs(sweep: ml_collections.ConfigDict) -> list[PlannedRun]:
  """One resolved run config per allocation (x seed x variant), in grid order.

  Each run evaluates `evals_per_run` times (every max(1, M // evals_per_run) steps,
  or log-spaced with eval_schedule='log'), so every allocation gets about the same
  number of points on its compute curve; it checkpoints every M // evals_per_run.
  Runs of a variant are named <variant>/<allocation>.
  """
  check_sweep_config(sweep)
  runs = []
  for variant, v_sweep in variant_sweeps(sweep):
    base = base_run_config(v_sweep)
    many = len(budgets(v_sweep)) > 1
    seeds = list(v_sweep.seeds) or [None]
    prefix = f"{variant}/" if variant else ""
    variant_runs = []
    for budget in budgets(v_sweep):
      for allocation in _allocations(v_sweep, base, budget):
        for seed in seeds:
          suffix = f"_s{seed}" if len(seeds) > 1 else ""
          variant_runs.append(PlannedRun(f"{prefix}{run_name(allocation, many)}{suffix}",
                                         allocation,
                                         _run_config(v_sweep, base, allocation, seed)))
    _check_split(base, variant_runs)
    runs += variant_runs
  return runs


def _check_split(base: ml_collections.ConfigDict, runs: Sequence[PlannedRun]) -> None:
  """A named split must exist and hold at least B_p training problems for every run."""
  if not base.task.split:
    return
  path = splits.split_path(base.task.splits_dir, base.task.split)
  if not path.is_file():
    raise SweepError(f"task.split={base.task.split!r}: {path} does not exist; create it "
                     "with `python -m launch.profile` (or run `python -m launch.study`)")
  num_train = splits.read_split_meta(base.task.splits_dir, base.task.split)["num_train"]
  if base.task.max_train_problems:
    num_train = min(num_train, base.task.max_train_problems)
  too_big = [r.name for r in runs if r.allocation.problems_per_batch > num_train]
  if too_big:
    raise SweepError(f"task.split={base.task.split!r} has {num_train} training problems, "
                     f"fewer than B_p of run(s) {', '.join(too_big)}")
