r"""The IsoCompute study in one command: profile -> sweep easy -> sweep hard -> analyses.

    python -m launch.study --out=/tmp/isojax/study
    python -m launch.study --out=/tmp/isojax/study --workers=1    # share the machine

Steps, each reusing what an earlier (interrupted) invocation finished, so rerunning
the same command resumes the study:

  1. `launch.profile` on --profile_config: the base model's avg@16 per problem and the
     paper's splits in DIR/splits/ (reused when the model and settings are unchanged).
  2. `launch.sweep` for each of --sweeps (default: every experiment, `EXPERIMENTS`), with
     the splits of step 1, into DIR/<sweep name>/ (finished runs are skipped,
     interrupted ones resume from their checkpoints).
  3. The analysis of each sweep: DIR/<name>/analysis.json and plots (val/avg@4),
     DIR/<name>/best@4/ and DIR/<name>/worst@4/ (per variant: DIR/<name>/<variant>/),
     and its experiment: DIR/<name>/experiment.json (effects with bootstrap
     intervals) and experiment.png.
  4. The findings table (`isojax.planner.findings`): DIR/findings.md, one row per
     claim of the paper with the measured effect, its interval and the verdict.

The default --sweeps are every experiment of the paper (EXPERIMENTS below). DIR/study.json
summarises the splits, each sweep's manifest, analyses and the findings. The exit
status is non-zero if a run or an analysis failed.
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import os
import sys
import time

from absl import app, flags, logging

from isojax import storage
from isojax.planner import analysis, findings
from isojax.sweeps import plan as sweep_plan
from isojax.sweeps import profiling
from isojax.sweeps import runner as sweep_runner
from launch import profile

_OUT = flags.DEFINE_string("out", None, "The study directory.", required=True)
_PROFILE_CONFIG = flags.DEFINE_string(
    "profile_config", "configs/hard.py", "Run config (file.py[:preset]) whose base model "
    "and sampling settings are profiled; the sweeps must use the same base model.")
# Every experiment of the IsoCompute paper, sized for the tiny default.
EXPERIMENTS = ["configs/sweep_easy.py", "configs/sweep_hard.py",
               "configs/sweep_fixed_batch.py", "configs/sweep_problems_per_batch.py",
               "configs/sweep_problem_set_size.py", "configs/sweep_decoupled.py",
               "configs/sweep_algorithms.py", "configs/sweep_reasoning.py"]
_SWEEPS = flags.DEFINE_list("sweeps", EXPERIMENTS,
                            "Sweep configs (file.py[:preset]) run in this order.")
_WORKERS = flags.DEFINE_integer("workers", 0, "Parallel runs (0: one per CPU core, 1 with "
                                "a GPU/TPU).")
_BUDGET = flags.DEFINE_integer("budget_rollouts", 0, "The budget C of every sweep (0: each "
                               "sweep config's own). A new budget needs a new --out.")
_PROFILE_OPTIONS = profile.define_option_flags()
flags.adopt_module_key_flags(profile)  # list them in --help

SPLITS_DIR = "splits"
STUDY_FILE = "study.json"


def _profile(out_dir: str) -> tuple[str, list[profiling.SplitSummary]]:
  config = sweep_plan.load_config_file(_PROFILE_CONFIG.value)
  options = _PROFILE_OPTIONS(os.path.join(out_dir, SPLITS_DIR))
  summaries = profiling.profile(config, options)
  print(profiling.format_table(summaries, options.num_samples), flush=True)
  return profiling.model_path(config), summaries


def _sweep(spec: str, out_dir: str, model: str, workers: int) -> dict:
  """Runs one sweep on the study's splits; returns its entry of study.json."""
  sweep = sweep_plan.load_config_file(spec)
  if _BUDGET.value:
    sweep.budget_rollouts = _BUDGET.value
  split = sweep.overrides.get("task", {}).get("split")
  if split:
    sweep.overrides.task.splits_dir = os.path.join(out_dir, SPLITS_DIR)
  run_model = profiling.model_path(sweep_plan.base_run_config(sweep))
  if split and run_model != model:
    raise sweep_plan.SweepError(
        f"{spec}: its runs use the base model {run_model}, but the splits were profiled "
        f"with {model}; use the same base model (or --profile_config)")
  sweep_dir = os.path.join(out_dir, sweep.name)
  manifest = sweep_plan.prepare(sweep, sweep_dir, "local")
  print(f"\n== sweep {sweep.name}: {len(manifest['runs'])} runs in {sweep_dir}", flush=True)
  failed = sweep_runner.run_local(sweep_dir, manifest, workers=workers,
                                  cache_dir=os.path.join(sweep_dir, sweep_plan.CACHE_DIR))
  entry = dict(dir=sweep_dir, config=spec, num_runs=len(manifest["runs"]), failed=failed,
               wall_s=sum(e.get("wall_s") or 0.0 for e in manifest["runs"]))
  try:
    summary = sweep_plan.analyze(sweep_dir, sweep)
    print(sweep_plan.format_analysis(summary), flush=True)
    entry["analysis"] = summary
  except analysis.AnalysisError as e:
    logging.error("analysis of %s failed: %s", sweep_dir, e)
    entry["analysis_error"] = str(e)
  return entry


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  out_dir = storage.absolute(_OUT.value)
  start = time.time()
  workers = _WORKERS.value or sweep_runner.default_workers()
  try:
    model, summaries = _profile(out_dir)
    sweeps = {}
    for spec in _SWEEPS.value:
      entry = _sweep(spec, out_dir, model, workers)
      sweeps[os.path.basename(entry["dir"])] = entry
  except (profiling.ProfileError, sweep_plan.SweepError) as e:
    raise SystemExit(f"launch.study: error: {e}") from None
  except (KeyboardInterrupt, sweep_runner.Interrupted):
    raise SystemExit("launch.study: interrupted; rerun the same command to resume") from None
  study = dict(out_dir=out_dir, model=model, wall_s=round(time.time() - start, 1),
               splits=[s.__dict__ for s in summaries], sweeps=sweeps)
  try:
    rows, text = findings.write_study_findings(out_dir)
    study["findings"] = [r.to_dict() for r in rows]
    print("\n" + text, flush=True)
  except FileNotFoundError as e:
    logging.error("no findings table: %s", e)
  storage.write_json(os.path.join(out_dir, STUDY_FILE), study)
  problems = [f"{name}: runs failed {e['failed']}" for name, e in sweeps.items() if e["failed"]]
  problems += [f"{name}: analysis failed ({e['analysis_error']})" for name, e in sweeps.items()
               if "analysis_error" in e]
  problems += [f"{name}: experiment failed ({e['analysis']['experiment']['error']})"
               for name, e in sweeps.items()
               if "error" in e.get("analysis", {}).get("experiment", {})]
  print(f"\nstudy written to {out_dir} ({STUDY_FILE}) in {study['wall_s']:.0f} s")
  if problems:
    print("\n".join(problems), file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
