r"""Run an iso-compute sweep: every allocation of a budget as an `isojax.main` run.

    python -m launch.sweep --config=configs/sweep_hard.py --out=/tmp/isojax/sweep_hard
    python -m launch.sweep --config=configs/sweep_hard.py:micro --out=/tmp/sweep_micro \
        --workers=2
    python -m launch.sweep --config=configs/sweep_hard.py --out=/shared/sweep_hard \
        --backend=slurm --slurm_nodes=2 --slurm_gpus_per_node=8
    python -m launch.sweep --config=configs/sweep_hard.py --out=/shared/sweep_hard \
        --backend=tpu

The sweep config (configs/sweep_*.py) names the base run config, its overrides, the
budget and the (B_p, n) ranges; the planner enumerates the allocations and each gets
`DIR/runs/bp<B_p>_n<n>/plan.json` and an entry in the manifest `DIR/sweep.json`.

  --backend=local  runs them here with --workers parallel subprocesses, skipping
                   finished runs and resuming interrupted ones (rerun the same command
                   after a crash or Ctrl-C), then writes the analysis: DIR/analysis.json
                   and plots for val/avg@4, DIR/best@4/ and DIR/worst@4/ for the others.
                   Exits non-zero if a run failed (the manifest has its error).
  --extend         local: a sweep rerun at a larger budget trains each run on from its
                   last checkpoint to the new length (num_steps raised, recorded in the
                   run's config_history.jsonl) instead of refusing the changed plans.
  --backend=slurm  writes DIR/sweep.slurm (an sbatch array, one task per run) and
                   DIR/runs.txt; --backend=tpu writes DIR/tpu_commands.sh. Neither is
                   submitted. Afterwards `--backend=local --norun` refreshes the manifest
                   from the run directories and writes the analysis.

DIR may be a gs:// URI with --backend=tpu (or --norun): every plan, manifest, run
directory and analysis file goes through `isojax.storage` (etils.epath).
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from isojax import configs, storage
from isojax.planner import analysis
from isojax.sweeps import cluster as cluster_scripts
from isojax.sweeps import sweep_analysis
from isojax.sweeps import sweep_config
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import manifest as sweep_manifest
from isojax.sweeps import runner as sweep_runner

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Sweep config file (configs/sweep_*.py[:preset]).", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "The sweep directory.", required=True)
_BACKEND = flags.DEFINE_enum("backend", "local", ["local", "slurm", "tpu"],
                             "Run here, or write a SLURM array / TPU-VM commands.")
_WORKERS = flags.DEFINE_integer("workers", 0, "Parallel runs of the local backend; 0: one "
                                "per CPU core (a tiny run keeps one core busy), 1 when a "
                                "GPU/TPU is visible.")
_RUN = flags.DEFINE_bool("run", True, "local: run unfinished runs. --norun only refreshes "
                         "the manifest from the run directories and analyses them.")
_EXTEND = flags.DEFINE_bool("extend", False, "local: train runs planned for a smaller "
                            "budget on to this one (the same run, trained longer) instead of "
                            "refusing their changed plans.")
_ANALYZE = flags.DEFINE_bool("analyze", True, "local: write the analysis after the runs.")
_FINISHED_CHECKPOINTS = flags.DEFINE_enum(
    "finished_checkpoints", "last", list(sweep_runner.FINISHED_CHECKPOINTS),
    "local: " + sweep_runner.FINISHED_CHECKPOINTS_HELP)
_CACHE = flags.DEFINE_string("compilation_cache", None, "XLA persistent compilation cache "
                             "shared by the runs (default DIR/jax_cache; '' disables).")
_PYTHON = flags.DEFINE_string("python", "python", "slurm/tpu: the interpreter on the nodes.")
_REPO = flags.DEFINE_string("repo_dir", "", "slurm/tpu: a directory on the nodes to run "
                            "from (an isojax checkout); empty: the isojax installed on "
                            "them (TPU: overridable with $REPO_DIR).")
_NODES = flags.DEFINE_integer("slurm_nodes", 1, "slurm: nodes per run (> 1: multi-host, "
                              "jax.distributed over one process per node).")
_GPUS = flags.DEFINE_integer("slurm_gpus_per_node", 0, "slurm: GPUs per node (0: none).")
_CPUS = flags.DEFINE_integer("slurm_cpus_per_task", 0, "slurm: CPUs per task (0: default).")
_TIME = flags.DEFINE_string("slurm_time", "", "slurm: time limit per run, e.g. 04:00:00.")
_PARTITION = flags.DEFINE_string("slurm_partition", "", "slurm: partition.")
_ACCOUNT = flags.DEFINE_string("slurm_account", "", "slurm: account.")
_MAX_PARALLEL = flags.DEFINE_integer("slurm_max_parallel", 0, "slurm: array throttle "
                                     "(at most this many runs at once; 0: no limit).")
_SIGNAL_S = flags.DEFINE_integer("slurm_signal_s", 300, "slurm: SIGTERM each run this many "
                                 "seconds before the time limit, so it saves the step it "
                                 "reached (0: no signal).")


def _cluster(manifest, out_dir: str) -> None:
  plans = [os.path.join(out_dir, e["plan"]) for e in manifest["runs"]]
  if _BACKEND.value == "slurm":
    options = cluster_scripts.SlurmOptions(
        nodes=_NODES.value, gpus_per_node=_GPUS.value, cpus_per_task=_CPUS.value,
        time=_TIME.value, partition=_PARTITION.value, account=_ACCOUNT.value,
        max_parallel=_MAX_PARALLEL.value, signal_s=_SIGNAL_S.value)
    written = cluster_scripts.write_slurm(manifest["name"], out_dir, plans, _REPO.value,
                                          _PYTHON.value, options)
    how = f"submit with: sbatch {written[-1]}"
  else:
    written = cluster_scripts.write_tpu(manifest["name"], out_dir, plans, _REPO.value,
                                        _PYTHON.value)
    how = f"run with: TPU_NAME=<tpu> ZONE=<zone> bash {written[-1]}"
  for path in written:
    print(f"wrote {path}")
  print(f"{len(plans)} runs; {how}")
  print(f"afterwards: python -m launch.sweep --config=... --out={out_dir} --backend=local "
        "--norun  (manifest + analysis)")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config=configs/sweep_hard.py")
  logging.set_verbosity(logging.INFO)
  out_dir = storage.absolute(_OUT.value)
  try:
    manifest = sweep_manifest.prepare(_CONFIG.value, out_dir, _BACKEND.value,
                                  extend=_EXTEND.value)
  except sweep_config.SweepError as e:
    raise SystemExit(f"launch.sweep: error: {e}") from None
  if _BACKEND.value != "local":
    _cluster(manifest, out_dir)
    return
  failed = []
  if _RUN.value:
    workers = _WORKERS.value or sweep_runner.default_workers()
    cache = (os.path.join(out_dir, sweep_layout.CACHE_DIR) if _CACHE.value is None
             else _CACHE.value)
    logging.info("%d runs (%d finished) with %d worker(s)", len(manifest["runs"]),
                 sum(e["state"] == sweep_layout.DONE for e in manifest["runs"]), workers)
    try:
      failed = sweep_runner.run_local(out_dir, manifest, workers=workers, cache_dir=cache,
                                      finished_checkpoints=_FINISHED_CHECKPOINTS.value)
    except sweep_config.SweepError as e:
      raise SystemExit(f"launch.sweep: error: {e}") from None
    except (KeyboardInterrupt, sweep_runner.Interrupted) as e:
      raise sweep_runner.interrupted_exit("launch.sweep", e) from None
  if _ANALYZE.value:
    try:
      print(sweep_analysis.format_analysis(sweep_analysis.analyze(out_dir, _CONFIG.value)))
    except analysis.AnalysisError as e:
      print(f"launch.sweep: analysis failed: {e}", file=sys.stderr)
      failed = failed or ["analysis"]
  unfinished = [e["name"] for e in manifest["runs"] if e["state"] != sweep_layout.DONE]
  if failed or unfinished:
    for e in manifest["runs"]:
      if e["state"] == sweep_layout.FAILED:
        print(f"FAILED {e['name']}: {e.get('error', '')}", file=sys.stderr)
    raise SystemExit(f"launch.sweep: {len(unfinished)} of {len(manifest['runs'])} runs not "
                     f"finished ({', '.join(unfinished) or 'analysis failed'}); see "
                     f"{os.path.join(out_dir, sweep_layout.MANIFEST_FILE)}")
  print(f"all {len(manifest['runs'])} runs finished; manifest "
        f"{os.path.join(out_dir, sweep_layout.MANIFEST_FILE)}")


if __name__ == "__main__":
  app.run(main, flags_parser=lambda argv: app.parse_flags_with_usage(configs.resolve_argv(argv)))
