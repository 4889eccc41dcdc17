r"""The IsoCompute study in one command: profile -> sweep easy -> sweep hard -> analyses.

    python -m launch.study --out=/tmp/isojax/study
    python -m launch.study --out=/tmp/isojax/study --workers=1    # share the machine
    python -m launch.study --out=/tmp/isojax/recall --profile_config= \
        --sweeps=configs/sweep_recall_easy.py,configs/sweep_recall_hard.py
    # three replicate seeds of every allocation: intervals over seeds, then problems
    python -m launch.study --out=/tmp/isojax/study --seeds=0,1,2 \
        --sweeps=configs/sweep_easy.py,configs/sweep_hard.py
    # train them on to 4x C (the same --seeds: they name the runs extended)
    python -m launch.study --out=/tmp/isojax/study --budget_rollouts=262144 --extend \
        --seeds=0,1,2 --sweeps=configs/sweep_easy.py,configs/sweep_hard.py
    # ... evaluating 24 times per plan instead of the configs' 12 (denser past the old end)
    python -m launch.study --out=/tmp/isojax/study --budget_rollouts=262144 --extend \
        --seeds=0,1,2 --evals_per_run=24 --sweeps=configs/sweep_easy.py,configs/sweep_hard.py

Steps, each reusing what an earlier (interrupted) invocation finished, so rerunning
the same command resumes the study:

  1. `launch.profile` on --profile_config: the base model's avg@16 per problem and the
     paper's splits in DIR/splits/ (reused when the model and settings are unchanged);
     skipped with an empty --profile_config (the recall task's difficulty is set by
     construction).
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
status is non-zero if a run or an analysis failed; a sweep with a failed run is not
analysed and the study then writes no findings table (rerun to retry the run). The
library is `isojax.sweeps.study`.
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import sys

from absl import app, flags, logging

from isojax import storage
from isojax.sweeps import sweep_config
from isojax.sweeps import profile_flags, profiling
from isojax.sweeps import runner as sweep_runner
from isojax.sweeps import study as study_lib

_OUT = flags.DEFINE_string("out", None, "The study directory.", required=True)
_PROFILE_CONFIG = flags.DEFINE_string(
    "profile_config", "configs/hard.py", "Run config (file.py[:preset]) whose base model "
    "and sampling settings are profiled; the sweeps must use the same base model. Empty: "
    "no profiling, for sweeps that use no profiled split (the recall task's).")
# Every experiment of the IsoCompute paper, sized for the tiny default.
EXPERIMENTS = ["configs/sweep_easy.py", "configs/sweep_hard.py",
               "configs/sweep_fixed_batch.py", "configs/sweep_problems_per_batch.py",
               "configs/sweep_problem_set_size.py", "configs/sweep_decoupled.py",
               "configs/sweep_algorithms.py", "configs/sweep_reasoning.py"]
_SWEEPS = flags.DEFINE_list("sweeps", EXPERIMENTS,
                            "Sweep configs (file.py[:preset]) run in this order.")
_WORKERS = flags.DEFINE_integer("workers", 0, "Parallel runs (0: one per CPU core, 1 with "
                                "a GPU/TPU).")
_FINISHED_CHECKPOINTS = flags.DEFINE_enum(
    "finished_checkpoints", "last", list(sweep_runner.FINISHED_CHECKPOINTS),
    sweep_runner.FINISHED_CHECKPOINTS_HELP)
_BUDGET = flags.DEFINE_integer("budget_rollouts", 0, "The budget C of every sweep (0: each "
                               "sweep config's own). A new budget needs a new --out, or --extend.")
_EXTEND = flags.DEFINE_bool("extend", False, "Train the runs of a study made at a smaller "
                            "--budget_rollouts on to this one (each the same run trained "
                            "longer) instead of refusing their plans.")
_EVALS = flags.DEFINE_integer("evals_per_run", 0, "Evaluations per run of every sweep (0: "
                               "each sweep config's own). With --extend it may rise: the "
                               "runs evaluate more densely past their old end.")
_SEEDS = flags.DEFINE_list("seeds", [], "Replicate seeds of every allocation of every sweep "
                           "(empty: each sweep config's own `seeds`). Seeds are the unit "
                           "of each interval: an allocation with one seed yields only "
                           "indicative verdicts.")
_PROFILE_OPTIONS = profile_flags.define_option_flags()
flags.adopt_module_key_flags(profile_flags)  # list them in --help


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not all(s.isdigit() for s in _SEEDS.value):
    raise app.UsageError(f"--seeds={','.join(_SEEDS.value)}: expected non-negative integers")
  try:
    overrides = study_lib.Overrides(budget=_BUDGET.value, evals_per_run=_EVALS.value,
                                    seeds=tuple(int(s) for s in _SEEDS.value))
  except sweep_config.SweepError as e:
    raise app.UsageError(f"--budget_rollouts, --evals_per_run or --seeds: {e}") from None
  logging.set_verbosity(logging.INFO)
  out_dir = storage.absolute(_OUT.value)
  workers = _WORKERS.value or sweep_runner.default_workers()
  try:
    study = study_lib.run(out_dir, profile_config=_PROFILE_CONFIG.value, sweeps=_SWEEPS.value,
                          workers=workers, options_from_dir=_PROFILE_OPTIONS,
                          overrides=overrides, extend=_EXTEND.value,
                          finished_checkpoints=_FINISHED_CHECKPOINTS.value)
  except (profiling.ProfileError, sweep_config.SweepError) as e:
    raise SystemExit(f"launch.study: error: {e}") from None
  except (KeyboardInterrupt, sweep_runner.Interrupted) as e:
    raise sweep_runner.interrupted_exit("launch.study", e) from None
  print(f"\nstudy written to {out_dir} ({study_lib.STUDY_FILE}) in {study['wall_s']:.0f} s")
  problems = study_lib.problems(study)
  if problems:
    print("\n".join(problems), file=sys.stderr)
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
