"""Sweep configs (`configs/sweep_*.py`): loading one, its fields and their checks, its
variants, and the base run config its overrides make. `SweepError` is every sweep
module's error for a config or directory that cannot be run as asked."""

from __future__ import annotations

from typing import Any, Sequence

import ml_collections

from isojax import configs, eval_settings, storage
from isojax.config import config_lib
from isojax.planner import experiments, time_to_value
from isojax.sweeps.layout import CACHE_DIR

_REQUIRED = ("name", "base_config", "overrides", "budget_rollouts", "problems_range",
             "rollouts_range", "max_batch_rollouts", "min_steps", "evals_per_run",
             "analysis")
# Fields a sweep config may leave out, with what leaving them out means.
OPTIONAL = dict(
    kind="iso_compute",    # the experiment (isojax.planner.experiments.KINDS)
    difficulty="",         # "easy" | "hard" | "": which of the paper's claims it tests
    variants={},           # name -> sweep fields to change; runs under runs/<name>/
    seeds=(),              # run seeds; () = the base config's seed only
    batch_rollouts=0,      # > 0: only allocations with B_p * n = this (fixed batch)
    train_fraction=0.0,    # > 0: PODS, train on m = max(2, n * this) of n rollouts
    eval_schedule="log",   # log: evals_per_run log-spaced (dense early, where the metric
                           # moves fastest; more decades of compute per evaluation);
                           # linear: every M // evals_per_run
    bootstrap_resamples=200,  # replicates behind each effect's interval
)


class SweepError(ValueError):
  """A sweep config or directory that cannot be run as asked."""


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file given as `path.py[:arg]`, loaded as `--config` loads it.

  A path that does not exist names a shipped config (`configs/hard.py`;
  `isojax.configs.find`).
  """
  try:
    return configs.load(spec)
  except FileNotFoundError as e:
    raise SweepError(str(e)) from None


def with_defaults(sweep: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of `sweep` with every optional field present."""
  full = ml_collections.ConfigDict(sweep.to_dict())
  for field, default in OPTIONAL.items():
    if field not in full:
      full[field] = ml_collections.ConfigDict() if isinstance(default, dict) else default
  return full


def check_sweep_config(sweep: ml_collections.ConfigDict) -> None:
  missing = [f for f in _REQUIRED if f not in sweep]
  if missing:
    raise SweepError(f"sweep config lacks field(s) {', '.join(missing)}")
  unknown = sorted(set(sweep.keys()) - set(_REQUIRED) - set(OPTIONAL))
  if unknown:
    raise SweepError(f"sweep config has unknown field(s) {', '.join(unknown)}; known: "
                     f"{', '.join(_REQUIRED + tuple(OPTIONAL))}")
  sweep = with_defaults(sweep)
  if sweep.evals_per_run < 1:
    raise SweepError(f"evals_per_run={sweep.evals_per_run}: expected >= 1")
  if not sweep.analysis.metrics:
    raise SweepError("analysis.metrics: expected at least one metric")
  if sweep.kind not in experiments.KINDS:
    raise SweepError(f"kind={sweep.kind!r}: expected one of {', '.join(experiments.KINDS)}")
  if sweep.eval_schedule not in eval_settings.SCHEDULES:
    raise SweepError(f"eval_schedule={sweep.eval_schedule!r}: expected one of "
                     f"{', '.join(eval_settings.SCHEDULES)}")
  if not 0.0 <= sweep.train_fraction < 1.0:
    raise SweepError(f"train_fraction={sweep.train_fraction}: expected 0 (off) or in (0, 1)")
  if sweep.batch_rollouts < 0:
    raise SweepError(f"batch_rollouts={sweep.batch_rollouts}: expected 0 (any) or > 0")
  check_seeds(sweep.seeds, "seeds")
  if sweep.bootstrap_resamples < 10:
    raise SweepError(f"bootstrap_resamples={sweep.bootstrap_resamples}: expected >= 10")
  for name, changes in sweep.variants.items():
    if not name or "/" in name or name == CACHE_DIR:
      raise SweepError(f"variants: name {name!r} must be a non-empty directory name")
    bad = sorted(set(changes.keys()) - set(_REQUIRED) - set(OPTIONAL) | (
        set(changes.keys()) & {"name", "variants", "kind", "base_config"}))
    if bad:
      raise SweepError(f"variants.{name}: cannot set field(s) {', '.join(bad)}")
  if sweep.kind == "decoupled_baseline" and set(sweep.variants) != set(
      experiments.DECOUPLED_VARIANTS):
    raise SweepError(f"kind=decoupled_baseline: expected the variants "
                     f"{', '.join(experiments.DECOUPLED_VARIANTS)}, got "
                     f"{', '.join(sweep.variants) or 'none'}")
  if sweep.kind == "per_problem" and set(sweep.variants) != set(time_to_value.VARIANTS):
    raise SweepError(f"kind=per_problem: expected the variants "
                     f"{', '.join(time_to_value.VARIANTS)}, got "
                     f"{', '.join(sweep.variants) or 'none'}")
  if sweep.kind in ("problem_set_size", "algorithms") and len(sweep.variants) < 2:
    raise SweepError(f"kind={sweep.kind}: expected at least two variants")
  if sweep.kind in ("iso_compute", "fixed_batch", "problems_per_batch") and sweep.variants:
    raise SweepError(f"kind={sweep.kind} takes no variants (kind=algorithms compares "
                     "variants of an iso-compute sweep)")


def check_seeds(seeds: Sequence[Any], name: str = "seeds") -> None:
  """Replicate seeds must be distinct non-negative integers: each names a run."""
  bad = [s for s in seeds if isinstance(s, bool) or not isinstance(s, int) or s < 0]
  if bad:
    raise SweepError(f"{name}={tuple(seeds)}: expected non-negative integers, got {bad}")
  if len(set(seeds)) != len(seeds):
    raise SweepError(f"{name}={tuple(seeds)}: expected distinct seeds (each names a run)")


def _deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
  out = dict(base)
  for key, value in changes.items():
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      out[key] = _deep_merge(out[key], value)
    else:
      out[key] = value
  return out


def variant_sweeps(sweep: ml_collections.ConfigDict
                   ) -> list[tuple[str, ml_collections.ConfigDict]]:
  """(variant name, the sweep with its changes) per variant; ("", sweep) with none."""
  sweep = with_defaults(sweep)
  if not sweep.variants:
    return [("", sweep)]
  base = sweep.to_dict()
  out = []
  for name, changes in sweep.variants.items():
    merged = _deep_merge(base, changes.to_dict())
    merged["variants"] = {}
    out.append((name, ml_collections.ConfigDict(merged)))
  return out


def base_run_config(sweep: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The base run config with the sweep's overrides; unknown fields are errors."""
  try:
    base = config_lib.override(load_config_file(sweep.base_config), sweep.overrides.to_dict(),
                               "sweep config overrides")
  except ValueError as e:
    raise SweepError(str(e)) from e
  # Workers run from the repository root: make paths independent of the current one.
  if base.task.split:
    base.task.splits_dir = storage.absolute(base.task.splits_dir)
  return base
