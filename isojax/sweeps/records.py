"""A study's or sweep's records: what its analysis and a resumed launch need, without
what only a run still going needs.

A study on a CPU takes longer than one machine may stay up; its directory is gigabytes
of checkpoints, but what the analysis reads and what tells a resumed launch that a run
is done are small text files. `copy` carries those between directories (into a
repository to keep beside the published tables, and back onto a fresh machine, where
the launch then runs only what is missing):

  kept     every file of the study or sweep (study.json, findings.md, the splits, the
           profile's journal of chunks measured so far, sweep.json, analysis.json) and,
           of each *finished* run directory, every file but its log;
  dropped  checkpoints/, the XLA cache (jax_cache/), run logs (log.txt, *.log),
           plots (*.png, redrawn by the analysis), lock files, and every unfinished
           run directory but its plan.json (it starts afresh from that plan where it
           is restored, so a plan copied while the run was pending, then re-planned,
           is replaced rather than left stale).

A run directory is one holding config.json or metrics.jsonl (`run_dir.find_runs`); it
is finished when its last metrics line is at config.json's num_steps.
"""

from __future__ import annotations

import dataclasses
import filecmp
import os
import shutil

from isojax import run_dir, storage
from isojax.sweeps import layout
from isojax.sweeps import manifest
from isojax.sweeps import runner

SKIPPED_DIRS = (run_dir.CHECKPOINT_DIR, layout.CACHE_DIR)
SKIPPED_SUFFIXES = (".log", ".png")  # `launch.reproduce`'s run logs; the analyses' plots
SKIPPED_FILES = (runner.LOG_FILE, runner.LOCK_FILE)


class RecordsError(ValueError):
  """A copy refused before any file was written."""


@dataclasses.dataclass(frozen=True)
class Copied:
  files: list[str]            # relative paths written (or already equal) at the destination
  finished_runs: list[str]    # relative run directories carried
  unfinished_runs: list[str]  # relative run directories left out


def is_finished(workdir: str) -> bool:
  """True when the run's last metrics line is at its config's num_steps."""
  try:
    num_steps = storage.read_json(run_dir.config_path(workdir))["num_steps"]
  except (FileNotFoundError, ValueError, KeyError, TypeError):
    return False
  return manifest.final_metrics(workdir, num_steps) is not None


def _skipped(name: str) -> bool:
  return name in SKIPPED_FILES or name.endswith(SKIPPED_SUFFIXES)


def plan(source: str) -> Copied:
  """What `copy` would carry from `source`: relative file paths and run directories."""
  if not os.path.isdir(source):
    raise RecordsError(f"--from={source}: not a directory")
  runs = {_relative(r, source): is_finished(r) for r in run_dir.find_runs(source)}
  files = []
  for dirpath, dirnames, filenames in os.walk(source):
    rel = _relative(dirpath, source)
    if rel in runs and not runs[rel]:
      dirnames[:] = []
      if layout.PLAN_FILE in filenames:
        files.append(os.path.join(rel, layout.PLAN_FILE))
      continue
    dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
    files += [os.path.join(rel, f) for f in sorted(filenames) if not _skipped(f)]
  return Copied(files=files, finished_runs=sorted(r for r, done in runs.items() if done),
                unfinished_runs=sorted(r for r, done in runs.items() if not done))


def _relative(path: str, root: str) -> str:
  rel = os.path.relpath(path, root)
  return "" if rel == "." else rel


def _has_checkpoints(workdir: str) -> bool:
  ckpt = os.path.join(workdir, run_dir.CHECKPOINT_DIR)
  return os.path.isdir(ckpt) and any(n.isdigit() for n in os.listdir(ckpt))


def copy(source: str, dest: str) -> Copied:
  """Copies `source`'s records (see the module) into `dest`, replacing files there.
  Refuses, before writing anything, a destination inside the source (or the reverse)
  and a finished run whose destination directory holds checkpoints and other metrics
  (a run going on there, which the copy would leave at odds with its checkpoints)."""
  src, dst = os.path.realpath(source), os.path.realpath(dest)
  if os.path.commonpath([src, dst]) in (src, dst):
    raise RecordsError(f"--from={source} and --to={dest}: one lies inside the other")
  copied = plan(source)
  for rel in copied.finished_runs:
    there = os.path.join(dest, rel)
    if _has_checkpoints(there) and not _same(os.path.join(source, rel, run_dir.METRICS_FILE),
                                             os.path.join(there, run_dir.METRICS_FILE)):
      raise RecordsError(
          f"{there}: holds checkpoints and metrics other than {os.path.join(source, rel)}'s "
          "finished run; move that directory aside or delete it, then copy again "
          "(nothing was copied)")
  for rel in copied.files:
    target = os.path.join(dest, rel)
    if _same(os.path.join(source, rel), target):
      continue
    os.makedirs(os.path.dirname(target), exist_ok=True)
    shutil.copyfile(os.path.join(source, rel), target + ".tmp")
    os.replace(target + ".tmp", target)
  return copied


def _same(a: str, b: str) -> bool:
  return os.path.isfile(b) and filecmp.cmp(a, b, shallow=False)
