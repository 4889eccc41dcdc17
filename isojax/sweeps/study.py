"""The IsoCompute study: profile -> every sweep -> their analyses -> the findings table.

The library behind `launch.study`. The sweeps are all prepared (and checked) before any
run starts; their runs then share one pool of workers, in the order of the sweeps, so
no worker waits for another sweep's last run. Each step reuses what an earlier
(interrupted) run of the study finished, so running it again on the same directory
resumes it: the splits are reused when the model and settings are unchanged, finished
sweep runs are skipped and interrupted ones resume from their checkpoints.
DIR/study.json summarises the splits, each sweep's manifest, analyses and the findings.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable, Sequence

from absl import logging
import ml_collections

from isojax import storage
from isojax.planner import analysis, findings
from isojax.sweeps import sweep_analysis
from isojax.sweeps import sweep_config
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import manifest as sweep_manifest
from isojax.sweeps import profiling
from isojax.sweeps import runner as sweep_runner

SPLITS_DIR = "splits"
STUDY_FILE = "study.json"


def profile(out_dir: str, profile_config: str, options: profiling.Options
            ) -> tuple[str, list[profiling.SplitSummary]]:
  """The splits of `profile_config`'s base model in DIR/splits; (the model, summaries)."""
  config = sweep_config.load_config_file(profile_config)
  summaries = profiling.profile(config, options)
  print(profiling.format_table(summaries, options.num_samples), flush=True)
  return profiling.model_path(config), summaries


@dataclasses.dataclass(frozen=True)
class Overrides:
  """What a study sets in every sweep over the sweep config's own (0 or (): keep it)."""
  budget: int = 0                  # C of every sweep
  evals_per_run: int = 0           # evaluations per run
  seeds: tuple[int, ...] = ()      # replicate seeds of every allocation

  def __post_init__(self):
    if self.budget < 0:
      raise sweep_config.SweepError(f"budget={self.budget}: expected >= 1, or 0 for each "
                                  "sweep config's own")
    if self.evals_per_run < 0:
      raise sweep_config.SweepError(f"evals_per_run={self.evals_per_run}: expected >= 1, or 0 "
                                  "for each sweep config's own")
    sweep_config.check_seeds(self.seeds)


def load_sweep(spec: str, overrides: Overrides = Overrides()) -> ml_collections.ConfigDict:
  """The sweep config `spec` with the study's `overrides` set over its own."""
  sweep = sweep_config.load_config_file(spec)
  if overrides.budget:
    sweep.budget_rollouts = overrides.budget
  if overrides.evals_per_run:
    sweep.evals_per_run = overrides.evals_per_run
  if overrides.seeds:
    sweep.seeds = tuple(overrides.seeds)
  return sweep


def prepare_sweep(spec: str, out_dir: str, model: str | None,
                  overrides: Overrides = Overrides(), extend: bool = False
                  ) -> tuple[ml_collections.ConfigDict, sweep_runner.LocalSweep]:
  """One sweep of the study, on its splits and ready to run (`model`: the profiled base
  model, None when nothing was profiled; `extend`: train runs planned for a smaller
  budget on, see `sweep_manifest.prepare`; `overrides`: see `load_sweep`)."""
  sweep = load_sweep(spec, overrides)
  split = sweep.overrides.get("task", {}).get("split")
  if split and model is None:
    raise sweep_config.SweepError(
        f"{spec}: its runs use the profiled split {split!r}, but this study profiles "
        "nothing (an empty profile config); give the base model's config to profile")
  if split:
    sweep.overrides.task.splits_dir = os.path.join(out_dir, SPLITS_DIR)
  run_model = profiling.model_path(sweep_config.base_run_config(sweep))
  if split and run_model != model:
    raise sweep_config.SweepError(
        f"{spec}: its runs use the base model {run_model}, but the splits were profiled "
        f"with {model}; use the same base model (or --profile_config)")
  sweep_dir = os.path.join(out_dir, sweep.name)
  manifest = sweep_manifest.prepare(sweep, sweep_dir, "local", extend=extend)
  print(f"\n== sweep {sweep.name}: {len(manifest['runs'])} runs "
        f"({manifest['total_rollouts']:,} rollouts) in {sweep_dir}", flush=True)
  return sweep, sweep_runner.LocalSweep(sweep_dir, manifest,
                                        os.path.join(sweep_dir, sweep_layout.CACHE_DIR))


def analyze_sweep(spec: str, sweep: ml_collections.ConfigDict,
                  local: sweep_runner.LocalSweep, failed: list[str]) -> dict:
  """The sweep's entry of study.json, with its analysis (or the analysis's error). A
  sweep with failed runs is not analysed: its fits would compare allocations some of
  whose runs stopped short of C, and a verdict seen on them would be an uncounted look."""
  runs = local.manifest["runs"]
  entry = dict(dir=local.out_dir, config=spec, num_runs=len(runs), failed=failed,
               wall_s=sum(e.get("wall_s") or 0.0 for e in runs))
  if failed:
    entry["analysis_error"] = (f"not analysed while runs {', '.join(failed)} have failed: "
                               "rerun the study to retry them")
    logging.error("%s: %s", local.out_dir, entry["analysis_error"])
    return entry
  try:
    summary = sweep_analysis.analyze(local.out_dir, sweep)
    print(sweep_analysis.format_analysis(summary), flush=True)
    entry["analysis"] = summary
  except analysis.AnalysisError as e:
    logging.error("analysis of %s failed: %s", local.out_dir, e)
    entry["analysis_error"] = str(e)
  return entry


def run(out_dir: str, *, profile_config: str, sweeps: Sequence[str], workers: int,
        options_from_dir: Callable[[str], profiling.Options],
        overrides: Overrides = Overrides(), extend: bool = False,
        finished_checkpoints: str = "last") -> dict[str, Any]:
  """The whole study into `out_dir`; returns study.json's contents (also written).

  `options_from_dir(splits_dir)` gives the profiling options. An empty `profile_config`
  profiles nothing: for sweeps on a task whose difficulty is set by construction (the
  recall task), which use no split. Raises ProfileError and SweepError (a run or an
  analysis that fails is recorded, not raised; a failed run's sweep is not analysed).
  No findings table is written while a run or a sweep's analysis has failed: the table
  reads every sweep's experiment.json, and one left by an earlier analysis, or a
  family missing a sweep, would be published as this study's verdicts.
  """
  start = time.time()
  model, summaries = None, []
  if profile_config:
    model, summaries = profile(out_dir, profile_config,
                               options_from_dir(os.path.join(out_dir, SPLITS_DIR)))
  # Every sweep is prepared (and checked) before any runs; then their runs share one
  # pool, so the workers a sweep's last runs leave free start the next sweep's.
  prepared = [prepare_sweep(spec, out_dir, model, overrides, extend) for spec in sweeps]
  failed = sweep_runner.run_local_sweeps([local for _, local in prepared], workers=workers,
                                         finished_checkpoints=finished_checkpoints)
  entries = {}
  for spec, (sweep, local), sweep_failed in zip(sweeps, prepared, failed, strict=True):
    entries[os.path.basename(local.out_dir)] = analyze_sweep(spec, sweep, local, sweep_failed)
  study = dict(out_dir=out_dir, model=model, wall_s=round(time.time() - start, 1),
               splits=[s.__dict__ for s in summaries], sweeps=entries)
  if any(failed) or any("analysis_error" in e for e in entries.values()):
    logging.error("no findings table while runs or analyses have failed: %s",
                  problems(study))
    storage.write_json(os.path.join(out_dir, STUDY_FILE), study)
    return study
  try:
    rows, text = findings.write_study_findings(out_dir)
    study["findings"] = [r.to_dict() for r in rows]
    print("\n" + text, flush=True)
  except FileNotFoundError as e:
    logging.error("no findings table: %s", e)
  storage.write_json(os.path.join(out_dir, STUDY_FILE), study)
  return study


def problems(study: dict[str, Any]) -> list[str]:
  """What failed in a study: runs, analyses, experiments; one line each."""
  sweeps = study["sweeps"]
  out = [f"{name}: runs failed {e['failed']}" for name, e in sweeps.items() if e["failed"]]
  out += [f"{name}: analysis failed ({e['analysis_error']})" for name, e in sweeps.items()
          if "analysis_error" in e]
  out += [f"{name}: experiment failed ({e['analysis']['experiment']['error']})"
          for name, e in sweeps.items()
          if "error" in e.get("analysis", {}).get("experiment", {})]
  return out
