"""Sweep plans: from a sweep config to run directories, a manifest and the analysis.

A sweep config (`configs/sweep_*.py`) names a base run config with overrides, a
budget C and the allocation ranges. `plan_runs` enumerates the planner's
iso-compute grid (`prescribe.sweep`) and resolves one run config per allocation
(`prescribe.to_config`, checked by `config_lib.resolve_dict`); `prepare` writes them
and the manifest, with each run's state read from its files; `analyze` fits the
results (`isojax.planner.analysis`, the library behind `launch.analyze`). The backends
then run the plans: locally (`isojax.sweeps.runner`) or through cluster scripts
(`isojax.sweeps.cluster`).
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

A sweep rerun at a larger budget with `extend` trains its runs on past their old end
(`resume_settings`: the same run trained longer) instead of refusing the changed plans:
each plan.json is rewritten with the new length (and what follows from it: the budget,
the evaluation and checkpoint cadence, and a splits directory that moved with a copied
sweep when its split file is the same), and its manifest entry records the allowance
the run is resumed with. `evals_per_run` may change with the budget: the extended run
evaluates where the new plan puts its evaluations past the old end.
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

from isojax import config_lib, configs, eval_settings, run_dir, storage
from isojax.planner import analysis, experiments, findings, grids, plots, prescribe
from isojax.tasks import splits

MANIFEST_FILE = "sweep.json"
RUNS_DIR = "runs"
PLAN_FILE = "plan.json"
CACHE_DIR = "jax_cache"
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
_MANIFEST_VERSION = 1
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


# --- Config files ----------------------------------------------------------------------


def load_config_file(spec: str) -> ml_collections.ConfigDict:
  """`get_config(arg)` of a config file given as `path.py[:arg]`, loaded by config_flags.

  A path that does not exist names a shipped config (`configs/hard.py`;
  `isojax.configs.find`).
  """
  try:
    found = configs.find_spec(spec)
  except FileNotFoundError as e:
    raise SweepError(str(e)) from None
  parser = config_flags.ConfigFileFlagParser(name="config", lock_config=False)
  return parser.parse(found)


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


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


# --- Run directories and the manifest --------------------------------------------------


def run_dir_of(out_dir: str, name: str) -> str:
  return os.path.join(storage.absolute(out_dir), RUNS_DIR, name)


def plan_path(out_dir: str, name: str) -> str:
  return os.path.join(run_dir_of(out_dir, name), PLAN_FILE)


def final_metrics(workdir: str, num_steps: int) -> dict[str, float] | None:
  """The last line's validation metrics if the run reached num_steps, else None."""
  try:
    last = run_dir.last_metrics(workdir)
  except run_dir.RunFormatError:
    return None
  if last is None or last[run_dir.STEP] != num_steps:
    return None
  return {k: v for k, v in last.items()
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


# The plan fields an extension changes; those of them a resume must be allowed to change.
# `eval.count` (evals_per_run) may change with it: where a run evaluates does not change
# what it trains, and a denser schedule sharpens the fits' late points.
EXTENSION_FIELDS = ("num_steps", "budget_rollouts", "eval.every", "eval.count",
                    "checkpoint_every", "task.splits_dir")
_EXTENSION_ALLOWANCE = ("num_steps", "eval.every", "eval.count", "task.splits_dir")


def _plan_change(path: str, config: dict[str, Any], extend: bool = False
                 ) -> tuple[bool, list[str]]:
  """Whether plan.json at `path` must be (re)written with `config`, and the fields its run
  must be allowed to change on resume (empty unless the plan is extended); raises
  SweepError if the plan there is another run's. Reads only.

  With `extend`, a plan there that is this one cut shorter is replaced."""
  config = _as_json(config)
  if not storage.path(path).is_file():
    return True, []
  existing = storage.read_json(path)
  if existing == config:
    return False, []
  old, new = _flatten(existing), _flatten(config)
  # A field the plan predates is unchanged when the new plan gives it its default:
  # `from_json` fills absent fields with the defaults, so the run is the same run.
  defaults = _flatten(_as_json(config_lib.base_config().to_dict()))
  changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                   and not (k not in old and k in defaults and new[k] == defaults[k]))
  if not changed:
    return False, []
  longer = (set(changed) <= set(EXTENSION_FIELDS) and "num_steps" in changed
            and new["num_steps"] > old["num_steps"] and _same_split(old, new))
  if extend and longer:
    return True, [f for f in _EXTENSION_ALLOWANCE if f in changed]
  hint = (f"; or extend it (--extend) from {old['num_steps']} to {new['num_steps']} steps"
          if longer else "")
  raise SweepError(
      f"{path}: the run there was planned differently (changed: {', '.join(changed)}); "
      f"use a new --out, or delete that run directory to redo it{hint}")


def _as_json(config: dict[str, Any]) -> dict[str, Any]:
  return json.loads(json.dumps(config))  # as JSON holds it (tuples become lists)


def _same_split(old: dict[str, Any], new: dict[str, Any]) -> bool:
  """Whether two flat plans train and evaluate on the same split: the same directory, or
  one whose split holds the same problems (a copy, or the same profile made again)."""
  if old.get("task.splits_dir") == new.get("task.splits_dir"):
    return True
  if not new.get("task.split"):
    return False
  try:
    payloads = [splits.read_split(p["task.splits_dir"], p["task.split"]) for p in (old, new)]
  except (FileNotFoundError, ValueError):
    return False
  return all(payloads[0][k] == payloads[1][k] for k in splits.SPLIT_KEYS)


def prepare(sweep: ml_collections.ConfigDict, out_dir: str, backend: str,
            extend: bool = False) -> dict[str, Any]:
  """Writes every plan.json and the manifest, with each run's state from its files;
  `extend` trains runs planned shorter on to this plan's length (see the module)."""
  runs = plan_runs(sweep)
  if extend and backend != "local":
    raise SweepError(f"--extend runs with --backend=local (asked: {backend})")
  # Every plan is checked before any is written: a refused sweep changes nothing.
  changes = {r.name: _plan_change(plan_path(out_dir, r.name), r.config, extend)
             for r in runs}
  for r in runs:
    if changes[r.name][0]:
      storage.write_json(plan_path(out_dir, r.name), _as_json(r.config), indent=2,
                         sort_keys=True)
  allowances = {name: allowance for name, (_, allowance) in changes.items()}
  old = {e["name"]: e for e in (read_manifest(out_dir) or {}).get("runs", [])}
  stale = sorted(set(old) - {r.name for r in runs})
  if stale:
    logging.warning("runs %s are in %s but not in this sweep config; the analysis of "
                    "%s/ still includes them", stale, MANIFEST_FILE, RUNS_DIR)
  entries = []
  for r in runs:
    entry = dict(old.get(r.name, {}), name=r.name, **r.allocation.to_dict(),
                 seed=r.config["seed"], plan=os.path.join(RUNS_DIR, r.name, PLAN_FILE))
    entry.setdefault("attempts", 0)
    # Kept in the entry: a launcher that stopped before the run resumed passes it again,
    # and once the run's history has the change, passing it changes nothing.
    if allowances[r.name]:
      entry["allow_changed"] = allowances[r.name]
    final = final_metrics(run_dir_of(out_dir, r.name), r.allocation.num_steps)
    if final is not None:
      entry.update(state=DONE, final=final)
    elif entry.get("state") != FAILED:
      # Never started, interrupted, or marked done by files that disagree: (re)run it.
      entry.update(state=PENDING, final=None)
    entries.append(entry)
  # What the sweep spends in all: every allocation's budget once per seed.
  total = sum(r.allocation.rollouts for r in runs)
  manifest = dict(version=_MANIFEST_VERSION, name=sweep.name, out_dir=storage.absolute(out_dir),
                  backend=backend, sweep_config=sweep.to_dict(), total_rollouts=total,
                  runs=entries)
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


def _analyze_metrics(runs_dir: str, target_dir: str, sweep: ml_collections.ConfigDict,
                     label: str = "") -> dict[str, dict[str, Any]]:
  metrics_list = list(sweep.analysis.metrics)
  primary = metrics_list[0]
  summary = {}
  for metric in metrics_list:
    options = analysis.Options(
        metric=metric, use_records=bool(sweep.analysis.records),
        fit_min_rollouts=float(sweep.analysis.fit_min_rollouts),
        companions=metric == primary)  # the primary's views already hold the companions
    result = analysis.analyze_directory(runs_dir, options)
    target = metric_dir(target_dir, metric, primary)
    written = analysis.write_analysis(result, os.path.join(target, analysis.ANALYSIS_FILE))
    plots.write_plots(result, target)
    end = written["frontier"][-1] if written["frontier"] else None
    summary[f"{label}/{metric}" if label else metric] = dict(
        dir=target, n_star_fit=written["n_star_fit"], frontier_end=end)
  return summary


def analyze(out_dir: str, sweep: ml_collections.ConfigDict) -> dict[str, Any]:
  """analysis.json and plots for each metric of `sweep.analysis.metrics` (per variant:
  DIR/<variant>/), then the experiment of the sweep's kind: DIR/experiment.json with
  each effect's bootstrap interval, and DIR/experiment.png.

  Returns {"metrics": {metric or variant/metric: {"dir", "n_star_fit",
  "frontier_end"}}, "experiment": {"path", "effects"} or {"error"}}; raises
  analysis.AnalysisError when the runs cannot be analysed.
  """
  sweep = with_defaults(sweep)
  runs_dir = os.path.join(out_dir, RUNS_DIR)
  variants = list(sweep.variants)
  summary: dict[str, Any] = {"metrics": {}}
  for variant, runs in experiments.variant_dirs(runs_dir, variants).items():
    summary["metrics"].update(_analyze_metrics(
        runs, os.path.join(out_dir, variant) if variant else out_dir, sweep, variant))
  try:
    result = experiments.analyze_experiment(
        runs_dir, sweep.kind, variants, metric=list(sweep.analysis.metrics)[0],
        num_resamples=sweep.bootstrap_resamples)
  except (analysis.AnalysisError, run_dir.RunFormatError) as e:
    logging.error("experiment analysis of %s failed: %s", out_dir, e)
    summary["experiment"] = {"error": str(e)}
    return summary
  result["difficulty"] = sweep.difficulty
  findings.record_look(out_dir, analysis.json_safe(result))
  path = os.path.join(out_dir, experiments.EXPERIMENT_FILE)
  storage.write_json(path, analysis.json_safe(result), indent=1, sort_keys=True,
                     allow_nan=False)
  plots.plot_experiment(result, os.path.join(out_dir, plots.EXPERIMENT))
  summary["experiment"] = {"path": path, "effects": {
      k: {f: e[f] for f in ("value", "lo", "hi")} for k, e in result["effects"].items()}}
  return summary


def format_analysis(summary: dict[str, Any]) -> str:
  """One line per metric: where its analysis is, the frontier's end, the n*(C) law;
  then the experiment's effects with their intervals."""
  lines = []
  for metric, s in summary["metrics"].items():
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
  exp = summary.get("experiment", {})
  if "error" in exp:
    lines.append(f"experiment: failed ({exp['error']})")
  elif exp:
    lines.append(f"experiment: {exp['path']}")
    lines += [f"  {name} = {e['value']:+.4f} [{e['lo']:+.4f}, {e['hi']:+.4f}]"
              for name, e in exp["effects"].items()]
  return "\n".join(lines)
