"""What the sections share: runs of `isojax.main` and `launch.study`, and their summaries.

A run goes to a fixed directory under the invocation's `out` and is reused when it
finished there, so rerunning the reproduce command resumes it; a finished run whose
settings are not the ones the command asks for now (a config changed since it ran) is
refused, naming the fields, rather than reported under the new settings. The wall time a table
reports is the one measured when the run ran (`TIMING_FILE`), not that of a rerun that
found it finished. The gain of a run is measured against the paired standard error:
both evaluations use the same problems, so the error of final - initial is the spread
over problems of each problem's own change, divided by sqrt(problems).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Sequence

import numpy as np
from absl import flags, logging
from ml_collections.config_flags import config_flags

from isojax import configs, metrics, run_dir, storage
from isojax.config import config_lib
from isojax.reproduce import tables
from isojax.run import resume_check
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import runner as sweep_runner

TIMING_FILE = "reproduce_timing.json"  # a run's wall time as this command measured it
TIMING_EVERY_S = 60.0  # how often a running study's wall time is saved


class StudyFailed(RuntimeError):
  """`launch.study` exited non-zero; rerunning resumes it."""


class StaleRun(ValueError):
  """A finished run whose settings differ from those the command asks for now."""


def paired_gain(counts0: Sequence[int], counts1: Sequence[int],
                num_samples: int) -> tuple[float, float]:
  """(final - initial mean pass rate, its standard error paired over problems)."""
  diff = (np.asarray(counts1, float) - np.asarray(counts0, float)) / num_samples
  if diff.size < 2:
    raise ValueError(f"a paired standard error needs at least 2 problems, got {diff.size}")
  return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


def summarize_run(workdir: str) -> dict[str, Any]:
  """Step-0 and final evaluation of a finished run, the gain, histograms, wall time."""
  config = storage.read_json(os.path.join(workdir, run_dir.CONFIG_FILE))
  lines = [r for r in run_dir.read_metrics(workdir) if metrics.val_avg(4) in r]
  if not lines or lines[0][run_dir.STEP] != 0:
    raise ValueError(f"{workdir}: no step-0 evaluation in {run_dir.METRICS_FILE}")
  first, last = lines[0], lines[-1]
  if last[run_dir.STEP] != config["num_steps"]:
    raise ValueError(f"{workdir}: last evaluation at step {last[run_dir.STEP]}, the run "
                     f"has {config['num_steps']} steps: unfinished")
  gain, gain_se = paired_gain(first[metrics.VAL_CORRECT_COUNTS],
                              last[metrics.VAL_CORRECT_COUNTS],
                              config["eval"]["num_samples"])
  timing = os.path.join(workdir, TIMING_FILE)
  recorded = storage.read_json(timing) if os.path.isfile(timing) else {}
  wall_s = recorded.get("wall_s", last[run_dir.WALL_S])
  pick = lambda r: {k: r.get(k) for k in (
      metrics.val_avg(4), metrics.val_avg(4) + "_stderr", "val/best@4", "val/worst@4",
      metrics.TRAIN_PASS1_HISTOGRAM)}
  return dict(seed=config["seed"], steps=config["num_steps"], initial=pick(first),
              final=pick(last), gain=gain, gain_se=gain_se,
              curve=[(r[run_dir.STEP], r[metrics.val_avg(4)]) for r in lines],
              wall_s=wall_s, peak_rss_gib=recorded.get("peak_rss_gib"))


def gain_in_se(summary: dict[str, Any]) -> str:
  """The gain in units of its standard error ("n/a" when every problem moved alike)."""
  return f"{summary['gain'] / summary['gain_se']:.1f}" if summary["gain_se"] else "n/a"


def run_main(inv: tables.Invocation, config: str, workdir: str, seed: str,
             extra: Sequence[str] = (), env: dict[str, str] | None = None) -> float:
  """`isojax.main` into `workdir` unless it finished there; returns its wall seconds
  (measured now, or as recorded when it ran). A run that finishes here keeps only its
  newest checkpoint (`run_dir.keep_the_last_checkpoint`), as a sweep's do."""
  timing = os.path.join(workdir, TIMING_FILE)
  try:
    wall_s = summarize_run(workdir)["wall_s"]
  except (FileNotFoundError, ValueError):
    wall_s = None
  if wall_s is not None:
    check_reused(workdir, config, seed, extra)
    return wall_s
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  start = time.time()
  cmd = [sys.executable, "-m", "isojax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.seed={seed}", *extra]
  with open(workdir + ".log", "w") as log:
    child = subprocess.Popen(cmd, cwd=inv.repo, stdout=log, stderr=subprocess.STDOUT,
                             env=env)
    # wait4: this child's own peak resident memory (the entry point re-executes itself
    # in place, so the pid is the run's).
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
  if child.returncode:
    raise subprocess.CalledProcessError(child.returncode, cmd)
  elapsed = time.time() - start
  run_dir.keep_the_last_checkpoint(workdir)
  storage.write_json(timing, dict(wall_s=elapsed, peak_rss_gib=usage.ru_maxrss * 1024 / 2**30))
  return elapsed


def requested_settings(config: str, seed: str, extra: Sequence[str] = ()
                       ) -> dict[str, Any]:
  """The settings `isojax.main --config=<config> --config.seed=<seed> <extra>` runs with
  (dotted, before the memory plan's passes), parsed as its `--config` flag parses them."""
  argv = ["isojax.main", f"--config={configs.find_spec(config)}", f"--config.seed={seed}",
          *extra]
  values = flags.FlagValues()
  # sys_argv: the overrides become flags of `values` (by default, those of sys.argv).
  config_flags.DEFINE_config_file("config", None, flag_values=values, lock_config=False,
                                  sys_argv=argv)
  values(argv)
  return resume_check.dotted_fields(config_lib.as_settings(values.config).to_dict())


def check_reused(workdir: str, config: str, seed: str, extra: Sequence[str] = ()) -> None:
  """Raises `StaleRun` when the finished run in `workdir` ran with settings other than
  the ones asked for (as a resume would be refused: `resume_check.changes`)."""
  changed = resume_check.changes(resume_check.recorded(workdir, step=sys.maxsize),
                                 requested_settings(config, seed, extra))
  if changed:
    raise StaleRun(f"{workdir} finished with other settings than {config} asks for now: "
                   f"{resume_check.describe(changed)}; remove it to run it again, or use a "
                   "new --out")


@dataclasses.dataclass(frozen=True)
class Job:
  """One `run_main` call."""
  config: str
  workdir: str
  seed: str
  extra: tuple[str, ...] = ()


def run_in_parallel(inv: tables.Invocation, jobs: Sequence[Job], out_dir: str,
                    workers: int | None = None) -> float:
  """Every job's `run_main`, `workers` at a time (default: one per core), each with
  single-threaded XLA kernels as a local sweep's workers run (the metrics are the same
  as one run's alone; side by side they finish sooner) and out_dir/jax_cache as their
  compilation cache. Returns the elapsed seconds over every invocation that ran them,
  kept in out_dir/TIMING_FILE and updated as each run ends. A failed run does not stop
  the others; the first failure is raised once they have ended."""
  workers = workers or sweep_runner.default_workers()
  env = sweep_runner.worker_env(workers, os.path.join(out_dir, sweep_layout.CACHE_DIR))
  timing = os.path.join(out_dir, TIMING_FILE)
  before = storage.read_json(timing)["wall_s"] if os.path.isfile(timing) else 0.0
  start, errors = time.time(), []
  os.makedirs(out_dir, exist_ok=True)
  pool = concurrent.futures.ThreadPoolExecutor(workers)
  try:
    futures = [pool.submit(run_main, inv, j.config, j.workdir, j.seed, j.extra, env)
               for j in jobs]
    for future in concurrent.futures.as_completed(futures):
      if future.exception() is not None:
        errors.append(future.exception())
      storage.write_json(timing, dict(wall_s=before + time.time() - start))
  finally:  # on Ctrl-C (the runs get it too and save their step) start no other run
    pool.shutdown(wait=True, cancel_futures=True)
  if errors:
    raise errors[0]
  return before + time.time() - start


def run_presets(inv: tables.Invocation, section: str, presets, seeds: Sequence[str]
                ) -> tuple[float, dict[str, list]]:
  """Each (name, config) of `presets` once per seed under out/section; (their summed
  wall seconds, {name: the runs' summaries})."""
  wall_s, runs = 0.0, {}
  for name, config in presets:
    runs[name] = []
    for seed in seeds:
      workdir = os.path.join(inv.out, section, f"{name}_s{seed}")
      logging.info("%s %s, seed %s -> %s", section, name, seed, workdir)
      wall_s += run_main(inv, config, workdir, seed)
      runs[name].append(summarize_run(workdir))
  return wall_s, runs


def launch_study(inv: tables.Invocation, study_dir: str, budget: int,
                 sweeps: Sequence[str] = (), study_flags: Sequence[str] = ()
                 ) -> tuple[str, float]:
  """`launch.study` into `study_dir` (resumed if there) with `study_flags` (its profile
  config and options); its findings table and the elapsed seconds over every
  invocation that ran it."""
  start = time.time()
  returncode, wall_s = _run_timed(
      [sys.executable, "-m", "launch.study", f"--out={study_dir}", f"--budget_rollouts={budget}",
       *([f"--sweeps={','.join(sweeps)}"] if sweeps else []), *study_flags],
      inv.repo, os.path.join(study_dir, TIMING_FILE))
  if returncode:
    raise StudyFailed(f"launch.study failed (exit {returncode}); rerun to resume it in "
                      f"{study_dir}")
  summary = os.path.join(study_dir, "study.json")  # = sweeps.study.STUDY_FILE
  if not os.path.isfile(summary) or os.path.getmtime(summary) < start:
    # Exit 0 without a new summary: preempted (SIGTERM), its runs pending.
    raise StudyFailed(f"launch.study was stopped before it finished; rerun to resume it in "
                      f"{study_dir}")
  with open(os.path.join(study_dir, "findings.md")) as f:
    return f.read(), wall_s


def _run_timed(cmd: Sequence[str], cwd: str, timing: str) -> tuple[int, float]:
  """Runs `cmd` and adds its elapsed seconds to those `timing` holds from earlier
  invocations, rewriting the sum every TIMING_EVERY_S and at the end, so an invocation
  killed part-way (this process stopped along with it) still counts, to the last
  write; (exit code, the seconds over every invocation). An error here (a full disk, an
  interrupt) kills the child rather than leave it running without its parent."""
  before = storage.read_json(timing)["wall_s"] if os.path.isfile(timing) else 0.0
  start = time.time()
  child = subprocess.Popen(cmd, cwd=cwd)
  try:
    while True:
      try:
        child.wait(timeout=TIMING_EVERY_S)
        break
      except subprocess.TimeoutExpired:
        storage.write_json(timing, dict(wall_s=before + time.time() - start))
  except BaseException:
    child.kill()
    child.wait()
    raise
  wall_s = before + time.time() - start
  storage.write_json(timing, dict(wall_s=wall_s))
  return child.returncode, wall_s


def study_dir(inv: tables.Invocation, budget: int) -> str:
  """Where the study section runs `launch.study` at `budget`; the algorithms section
  reads its RQ4 sweep from there rather than running the same sweep again."""
  return os.path.join(inv.out, f"study_C{budget}")


def sweep_seconds(root: str) -> float:
  """Seconds the runs under `root` spent in steps and evaluations (each run's last
  `wall_s`): one sweep's machine time inside a study that ran others too."""
  return sum((run_dir.last_metrics(w) or {}).get(run_dir.WALL_S, 0.0)
             for w in run_dir.find_runs(root))


def findings_of(findings: str, sweep: str) -> str:
  """`findings` (launch.study's findings.md) with only the table rows of `sweep` (its
  own rows and those of its variants, `sweep/...`); a later section left without rows
  is dropped, heading and prose with it."""
  def keep(cells: list[str], column: int) -> bool:   # column -1: a table without sweeps
    if column < 0:
      return True
    name = cells[column].strip()
    return name == sweep or name.startswith(sweep + "/")

  kept = []
  for i, section in enumerate(re.split(r"\n(?=## )", findings.strip())):
    lines, column, rows, has_table = [], None, 0, False
    for line in section.splitlines():
      if not line.startswith("|"):
        column = None if not line.strip() else column
        lines.append(line)
        continue
      cells = line.split("|")[1:-1]
      if column is None:                         # a table's header row
        names = [c.strip() for c in cells]
        column, has_table = (names.index("sweep") if "sweep" in names else -1), True
        lines.append(line)
      elif set(line) <= set("|-: "):             # its separator row
        lines.append(line)
      elif keep(cells, column):
        lines.append(line)
        rows += 1
    if i == 0 or rows or not has_table:
      kept.append("\n".join(lines).strip())
  return "\n\n".join(kept) + "\n"


def study_images(study_dir: str, results: str, prefix: str, only: str = "") -> list[str]:
  """Each sweep's metric-vs-compute plot (a sweep with variants has one per variant)
  copied into results/img, or only those of sweep `only`; their Markdown links."""
  images = []
  for name in sorted(os.listdir(study_dir)):
    if only and name != only:
      continue
    sweep = os.path.join(study_dir, name)
    variants = sorted(os.listdir(sweep)) if os.path.isdir(sweep) else []
    for part in ["", *variants]:
      png = os.path.join(sweep, part, "metric_vs_compute.png")
      if os.path.isfile(png):
        label = f"{name}_{part}" if part else name
        target = os.path.join(results, "img", f"{prefix}_{label}_metric_vs_compute.png")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(png, target)
        images.append(f"![{label}](img/{os.path.basename(target)})")
  return images
