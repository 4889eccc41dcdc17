"""Sweep plans: from a sweep config to run directories, a manifest and the analysis.

A sweep config (`configs/sweep_*.py`) names a base run config with overrides, a
budget C and the allocation ranges. `plan_runs` enumerates the planner's
iso-compute grid (`prescribe.sweep`) and resolves one run config per allocation
(`prescribe.to_config`); `prepare` writes them and the manifest, with each run's
state read from its files; `analyze` fits the results (`isojax.planner.analysis`,
the library behind `launch.analyze`). The backends then run the plans: locally
(`launch.sweep_runner`) or through cluster scripts (`launch.cluster_scripts`).
A sweep directory DIR:

  DIR/sweep.json               the manifest: each run's allocation, state (pending,
                               running, done, failed), return code, wall time, final
                               validation metrics
  DIR/runs/<name>/plan.json    the run's resolved config; <name> = bp<B_p>_n<n>
  DIR/runs/<name>/log.txt      the run's output, one header per attempt
  DIR/runs/<name>/...          config.json, metrics.jsonl, checkpoints/ (isojax.run_dir)
  DIR/analysis.json, *.png     the analysis of the primary metric (val/avg@4)
  DIR/<metric>/                the same for each further metric (best@4/, worst@4/)
  DIR/jax_cache/               XLA's persistent compilation cache, shared by the runs

A run is finished when its metrics.jsonl ends at step = num_steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from typing import Any, Sequence

import ml_collections
from absl import logging
from ml_collections.config_flags import config_flags

from isojax import config_lib, run_dir, storage
from isojax.planner import analysis, grids, plots, prescribe
from isojax.tasks import splits

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST_FILE = "sweep.json"
RUNS_DIR = "runs"
PLAN_FILE = "plan.json"
CACHE_DIR = "jax_cache"
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
_MANIFEST_VERSION = 1
_REQUIRED = ("name", "base_config", "overrides", "budget_rollouts", "problems_range",
             "rollouts_range", "max_batch_rollouts", "min_steps", "evals_per_run",
             "analysis")


class SweepError(ValueError):
  """A sweep config or directory that cannot be run as asked."""


# --- Config files ----------------------------------------------------------------------


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file given as `path.py[:arg]`, loaded by config_flags.

  A relative path is looked up in the current directory, then in the repository.
  """
  path, _, arg = spec.partition(":")
  candidates = [path] if os.path.isabs(path) else [path, os.path.join(REPO_ROOT, path)]
  found = next((p for p in candidates if os.path.isfile(p)), None)
  if found is None:
    raise SweepError(f"config file {path!r} does not exist (looked in "
                     f"{', '.join(os.path.abspath(p) for p in candidates)})")
  parser = config_flags.ConfigFileFlagParser(name="config", lock_config=False)
  return parser.parse(f"{found}:{arg}" if arg else found)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def check_sweep_config(sweep: ml_collections.ConfigDict) -> None:
  missing = [f for f in _REQUIRED if f not in sweep]
  if missing:
    raise SweepError(f"sweep config lacks field(s) {', '.join(missing)}")
  if sweep.evals_per_run < 1:
    raise SweepError(f"evals_per_run={sweep.evals_per_run}: expected >= 1")
  if not sweep.analysis.metrics:
    raise SweepError("analysis.metrics: expected at least one metric")


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


# --- Plans ---------------------------------------------------------------------------


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


def plan_runs(sweep: ml_collections.ConfigDict) -> list[PlannedRun]:
  """One resolved run config per allocation of the sweep's budget(s), in grid order.

  Each run evaluates (and checkpoints) every max(1, M // evals_per_run) steps, so
  every allocation gets about the same number of points on its compute curve.
  """
  check_sweep_config(sweep)
  base = base_run_config(sweep)
  many = len(budgets(sweep)) > 1
  runs = []
  for budget in budgets(sweep):
    try:
      allocations = prescribe.sweep(
          budget, base, max_batch_rollouts=sweep.max_batch_rollouts,
          problems_range=tuple(sweep.problems_range),
          rollouts_range=tuple(sweep.rollouts_range), min_steps=sweep.min_steps, exact=True)
    except grids.BudgetTooSmallError as e:
      raise SweepError(f"budget_rollouts={budget}: {e}") from e
    for allocation in allocations:
      config = ml_collections.ConfigDict(base.to_dict())
      every = max(1, allocation.num_steps // sweep.evals_per_run)
      config.eval.every = every
      config.checkpoint_every = every
      try:
        resolved = prescribe.to_config(allocation, config)
      except ValueError as e:
        raise SweepError(f"allocation {allocation.to_dict()}: {e}") from e
      runs.append(PlannedRun(run_name(allocation, many), allocation, resolved.to_dict()))
  _check_split(base, runs)
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
  too_big = [r.name for r in runs if r.allocation.problems_per_batch > num_train]
  if too_big:
    raise SweepError(f"task.split={base.task.split!r} has {num_train} training problems, "
                     f"fewer than B_p of run(s) {', '.join(too_big)}")


# --- Run directories and the manifest --------------------------------------------------


def run_dir_of(out_dir: str, name: str) -> str:
  return os.path.join(storage.absolute(out_dir), RUNS_DIR, name)


def plan_path(out_dir: str, name: str) -> str:
  return os.path.join(run_dir_of(out_dir, name), PLAN_FILE)


def final_metrics(workdir: str, num_steps: int) -> dict[str, float] | None:
  """The last line's validation metrics if the run reached num_steps, else None."""
  try:
    lines = run_dir.read_metrics(workdir)
  except run_dir.RunFormatError:
    return None
  if not lines or lines[-1][run_dir.STEP] != num_steps:
    return None
  return {k: v for k, v in lines[-1].items()
          if k.startswith("val/") and isinstance(v, (int, float))}


def read_manifest(out_dir: str) -> dict[str, Any] | None:
  path = storage.path(out_dir) / MANIFEST_FILE
  if not path.is_file():
    return None
  try:
    return storage.read_json(path)
  except ValueError as e:
    raise SweepError(f"{e}; delete it to rebuild it from the run directories") from e


def write_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
  manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
  storage.write_json(storage.path(out_dir) / MANIFEST_FILE, manifest)


def _write_plan(path: str, config: dict[str, Any]) -> None:
  """Writes plan.json, or checks that the one there is the same plan."""
  config = json.loads(json.dumps(config))  # as JSON holds it (tuples become lists)
  if not storage.path(path).is_file():
    storage.write_json(path, config, indent=2, sort_keys=True)
    return
  existing = storage.read_json(path)
  if existing != config:
    old, new = _flatten(existing), _flatten(config)
    changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    raise SweepError(
        f"{path}: the run there was planned differently (changed: {', '.join(changed)}); "
        "use a new --out, or delete that run directory to redo it")


def prepare(sweep: ml_collections.ConfigDict, out_dir: str, backend: str
            ) -> dict[str, Any]:
  """Writes every plan.json and the manifest, with each run's state from its files."""
  runs = plan_runs(sweep)
  for r in runs:
    _write_plan(plan_path(out_dir, r.name), r.config)
  old = {e["name"]: e for e in (read_manifest(out_dir) or {}).get("runs", [])}
  stale = sorted(set(old) - {r.name for r in runs})
  if stale:
    logging.warning("runs %s are in %s but not in this sweep config; the analysis of "
                    "%s/ still includes them", stale, MANIFEST_FILE, RUNS_DIR)
  entries = []
  for r in runs:
    entry = dict(old.get(r.name, {}), name=r.name, **r.allocation.to_dict(),
                 plan=os.path.join(RUNS_DIR, r.name, PLAN_FILE))
    entry.setdefault("attempts", 0)
    final = final_metrics(run_dir_of(out_dir, r.name), r.allocation.num_steps)
    if final is not None:
      entry.update(state=DONE, final=final)
    elif entry.get("state") != FAILED:
      # Never started, interrupted, or marked done by files that disagree: (re)run it.
      entry.update(state=PENDING, final=None)
    entries.append(entry)
  manifest = dict(version=_MANIFEST_VERSION, name=sweep.name, out_dir=storage.absolute(out_dir),
                  backend=backend, sweep_config=sweep.to_dict(), runs=entries)
  write_manifest(out_dir, manifest)
  return manifest


def format_final(final: dict[str, float] | None) -> str:
  """A run's final validation metrics on one line."""
  if not final:
    return "no metrics"
  return " ".join(f"{k}={v:.4f}" for k, v in sorted(final.items())
                  if not k.endswith("_stderr"))


# --- Analysis --------------------------------------------------------------------------


def metric_dir(out_dir: str, metric: str, primary: str) -> str:
  """DIR for the primary metric, DIR/<metric without 'val/'> for the others."""
  if metric == primary:
    return out_dir
  return os.path.join(out_dir, metric.split("/", 1)[-1])


def analyze(out_dir: str, sweep: ml_collections.ConfigDict) -> dict[str, dict[str, Any]]:
  """analysis.json and plots for each metric of `sweep.analysis.metrics`.

  Returns {metric: {"dir", "n_star_fit", "frontier_end"}}; raises
  analysis.AnalysisError when the runs cannot be analysed.
  """
  metrics_list = list(sweep.analysis.metrics)
  primary = metrics_list[0]
  summary = {}
  for metric in metrics_list:
    options = analysis.Options(
        metric=metric, use_records=bool(sweep.analysis.records),
        fit_min_rollouts=float(sweep.analysis.fit_min_rollouts),
        companions=metric == primary)  # the primary's views already hold the companions
    result = analysis.analyze_directory(os.path.join(out_dir, RUNS_DIR), options)
    target = metric_dir(out_dir, metric, primary)
    written = analysis.write_analysis(result, os.path.join(target, analysis.ANALYSIS_FILE))
    plots.write_plots(result, target)
    end = written["frontier"][-1] if written["frontier"] else None
    summary[metric] = dict(dir=target, n_star_fit=written["n_star_fit"], frontier_end=end)
  return summary


def format_analysis(summary: dict[str, dict[str, Any]]) -> str:
  """One line per metric: where its analysis is, the frontier's end, the n*(C) law."""
  lines = []
  for metric, s in summary.items():
    line = f"{metric}: {os.path.join(s['dir'], analysis.ANALYSIS_FILE)}"
    end = s["frontier_end"]
    if end:
      line += (f"; best at C={end['rollouts']:.6g}: B_p={end['problems_per_batch']}, "
               f"n={end['rollouts_per_problem']} ({end['value']:.4f})")
    law = s["n_star_fit"]
    if law and law.get("n_saturation") is not None and math.isfinite(law["n_saturation"]):
      line += f"; fitted n*(C) from n={law['n_low']:.3g} to n={law['n_saturation']:.3g}"
      if law.get("censored"):
        line += " (the frontier ends at the largest n swept)"
    lines.append(line)
  return "\n".join(lines)
