"""A sweep directory's layout, shared by the planner, the manifest, the runners and
the analysis:

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

import os

from isojax import storage

MANIFEST_FILE = "sweep.json"
RUNS_DIR = "runs"
PLAN_FILE = "plan.json"
CACHE_DIR = "jax_cache"
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"


def run_dir_of(out_dir: str, name: str) -> str:
  return os.path.join(storage.absolute(out_dir), RUNS_DIR, name)


def plan_path(out_dir: str, name: str) -> str:
  return os.path.join(run_dir_of(out_dir, name), PLAN_FILE)
