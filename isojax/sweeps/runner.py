"""The local backend of `launch.sweep`: a pool of `python -m isojax.main` subprocesses.

`run_local` runs every unfinished run of a prepared sweep (`isojax.sweeps.manifest`) with
`workers` parallel subprocesses, each with its output in the run's log.txt, and keeps
the manifest current. Finished runs are never relaunched; anything else is relaunched
with the same command, which resumes from the run's last checkpoint. A lock file held
by the run's process (inherited by it, so it outlives a killed launcher) keeps two
launchers from running the same run at once. Failed runs are recorded and the others
go on; a run that was preempted (SIGTERM: it saved its step and exited 0) is pending,
resumed by the next launch. `run_local_sweeps` runs several sweeps (a study's) in one
pool.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import signal
import subprocess
import sys
import time
from typing import Any

import tqdm
from absl import logging

import isojax
from isojax import configs, metrics, run_dir, storage
from isojax.sweeps import sweep_config
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import manifest as sweep_manifest
from isojax.sweeps.layout import DONE, FAILED, PENDING, RUNNING

LOCK_FILE = ".lock"
LOG_FILE = "log.txt"
# How long a stopped launcher waits for each run to finish its step and save it (a run
# saves on SIGTERM) before it kills the run; the run then resumes from its last save.
STOP_GRACE_S = 300
# What a finished run keeps of its checkpoints: `last`, its newest (what `--extend`
# trains on from; a real model's run otherwise holds several GiB of earlier ones), or
# `all` it saved.
FINISHED_CHECKPOINTS = ("last", "all")
FINISHED_CHECKPOINTS_HELP = ("what a finished run keeps of its checkpoints: its newest "
                             "(what --extend trains on from), or all it saved.")

# The directory the running isojax package was imported from.
_IMPORT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(isojax.__file__)))


def default_workers() -> int:
  """One worker per CPU core, or 1 when an accelerator is visible.

  A tiny-model run alone does not keep every core busy (XLA's threads help little at
  these sizes), and single-threaded runs side by side finish sooner than one after the
  other, so on CPU one single-threaded run per core gives the most runs per hour. On a
  GPU or TPU each run takes the whole accelerator.
  """
  accelerator = any(os.path.exists(p) for p in ("/dev/nvidia0", "/dev/accel0", "/dev/vfio/0"))
  if accelerator:
    return 1
  return max(1, len(os.sched_getaffinity(0)))


def worker_env(workers: int, cache_dir: str | None,
               base: dict[str, str] | None = None) -> dict[str, str]:
  """The environment of each `isojax.main` subprocess."""
  env = dict(os.environ if base is None else base)
  if workers > 1:
    # Single-threaded XLA CPU kernels, so workers do not oversubscribe the cores
    # (the metrics are identical either way), and no up-front grab of GPU
    # memory by each of several processes.
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
  if cache_dir:
    # Runs of a sweep share shapes (the evaluation sampler, equal batch sizes):
    # a persistent cache lets a run reuse what earlier runs compiled.
    # The sweep's directory wins over one already in the environment.
    env["JAX_COMPILATION_CACHE_DIR"] = os.path.abspath(cache_dir)
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  elif cache_dir == "":  # disabled (--compilation_cache=''), also if the environment set one
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
  # The run imports the isojax this launcher imported (an installed package, or a
  # checkout on the path), whatever its working directory.
  env["PYTHONPATH"] = os.pathsep.join(filter(None, (_IMPORT_ROOT, env.get("PYTHONPATH"))))
  return env


def main_command(plan: str, workdir: str, python: str = sys.executable,
                 allow_changed: tuple[str, ...] | list[str] = ()) -> list[str]:
  """The run's command; `allow_changed`: the fields an extended plan changed."""
  return [python, "-m", "isojax.main", f"--config={configs.shipped('from_json.py')}:{plan}",
          f"--workdir={workdir}",
          *([f"--allow_changed={','.join(allow_changed)}"] if allow_changed else [])]


def _try_lock(workdir: str):
  """An open file holding an exclusive lock on the run, or None if another has it."""
  os.makedirs(workdir, exist_ok=True)
  f = open(os.path.join(workdir, LOCK_FILE), "w")
  try:
    fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as e:
    f.close()
    if e.errno in (errno.EAGAIN, errno.EACCES):
      return None
    raise
  return f


class Interrupted(Exception):
  """The launcher got SIGTERM or SIGINT; the running runs were stopped (each saved the
  step it reached) and marked pending. `signal_name` is which."""

  @property
  def signal_name(self) -> str:
    return str(self.args[0]) if self.args else "SIGINT"


def interrupted_exit(tool: str, e: BaseException) -> SystemExit:
  """How a launcher ends when interrupted: on SIGTERM (a scheduler's preemption) with
  status 0, as `isojax.main` does, so a requeue wrapper does not count it a failure; on
  SIGINT (Ctrl-C) with 130, the shell's convention. Both say how to resume."""
  name = e.signal_name if isinstance(e, Interrupted) else "SIGINT"
  message = (f"{tool}: interrupted ({name}): the running runs saved the step they reached "
             "and are pending; rerun the same command to resume")
  print(message, file=sys.stderr, flush=True)
  return SystemExit(0 if name == "SIGTERM" else 130)


class _SignalFlag:
  """Records SIGTERM / SIGINT for the loop to act on at its next safe point.

  Raising from the handler could land between `Popen` returning and the run being
  tracked, leaving a worker nobody stops; the loop instead checks `raise_if_set`
  after every start and every poll.
  """

  def __init__(self):
    self.signum: int | None = None

  def __call__(self, signum, frame):
    del frame
    self.signum = signum

  def raise_if_set(self):
    if self.signum is not None:
      raise Interrupted(signal.Signals(self.signum).name)


def _log_tail(path: str, lines: int = 15) -> str:
  try:
    with open(path, errors="replace") as f:
      return "".join(f.readlines()[-lines:])
  except OSError:
    return ""


@dataclasses.dataclass(frozen=True)
class LocalSweep:
  """A prepared sweep for the local pool: its directory, manifest (kept current in
  place) and compilation cache (None: the environment's)."""
  out_dir: str
  manifest: dict[str, Any]
  cache_dir: str | None


@dataclasses.dataclass
class _Active:
  sweep: LocalSweep
  entry: dict[str, Any]
  proc: subprocess.Popen
  lock: Any
  log: Any
  start: float


def run_local(out_dir: str, manifest: dict[str, Any], *, workers: int,
              cache_dir: str | None, poll_s: float = 0.5,
              finished_checkpoints: str = "last") -> list[str]:
  """Runs every unfinished run with `workers` parallel subprocesses.

  Returns the names of the runs that failed. SIGTERM / Ctrl-C stop the running
  subprocesses, mark them pending and leave the manifest consistent.
  `finished_checkpoints`: see `FINISHED_CHECKPOINTS`.
  """
  return run_local_sweeps([LocalSweep(out_dir, manifest, cache_dir)], workers=workers,
                          poll_s=poll_s, finished_checkpoints=finished_checkpoints)[0]


def run_local_sweeps(sweeps: list[LocalSweep], *, workers: int, poll_s: float = 0.5,
                     finished_checkpoints: str = "last") -> list[list[str]]:
  """`run_local` for several sweeps sharing one pool: their runs in order (a sweep's
  after the one before it), and a worker a sweep's last runs leave free takes the next
  sweep's first. Returns each sweep's failed runs."""
  for s in sweeps:
    if storage.is_uri(s.out_dir):
      raise sweep_config.SweepError(
          f"--out={s.out_dir}: the local backend locks and logs each run in its directory, "
          "which needs a local (or mounted) path; run gs:// sweeps with --backend=tpu, or "
          "use --norun to refresh the manifest and analysis there")
  if finished_checkpoints not in FINISHED_CHECKPOINTS:
    raise sweep_config.SweepError(
        f"--finished_checkpoints={finished_checkpoints!r}: expected one of "
        f"{', '.join(FINISHED_CHECKPOINTS)}")
  prune = finished_checkpoints == "last"
  for s in sweeps:
    for e in s.manifest["runs"]:
      if e["state"] == DONE:
        logging.info("skipping %s: finished (%s)", e["name"],
                     sweep_manifest.format_final(e.get("final")))
        if prune:
          _keep_the_last_checkpoint_unless_running(sweep_layout.run_dir_of(s.out_dir,
                                                                           e["name"]))
  queue = [(s, e) for s in sweeps for e in s.manifest["runs"] if e["state"] != DONE]
  if queue:
    _pool(sweeps, queue, workers, poll_s, prune)
  return [[e["name"] for e in s.manifest["runs"] if e["state"] == FAILED] for s in sweeps]


def _pool(sweeps: list[LocalSweep], queue: list, workers: int, poll_s: float,
          prune: bool) -> None:
  """Runs `queue`'s (sweep, entry) pairs, at most `workers` at once, writing a sweep's
  manifest at each change of one of its runs; with `prune`, a run that finishes keeps
  only its last checkpoint."""
  envs = {id(s): worker_env(workers, s.cache_dir) for s in sweeps}
  total = sum(len(s.manifest["runs"]) for s in sweeps)
  count = total - len(queue)
  active, busy, waiting = [], [], set()
  # The bar shows on a terminal; logs get one line per finished run either way.
  name = (f"sweep {sweeps[0].manifest['name']}" if len(sweeps) == 1 else
          f"{len(sweeps)} sweeps")
  bar = tqdm.tqdm(total=total, initial=count, unit="run", desc=name, dynamic_ncols=True,
                  disable=None)
  received = _SignalFlag()
  # A second signal while the workers stop is only recorded: the stop runs to its end.
  previous_handlers = {signum: signal.signal(signum, received)
                       for signum in (signal.SIGTERM, signal.SIGINT)}
  try:
    while queue or active or busy:
      received.raise_if_set()
      while queue and len(active) < workers:
        received.raise_if_set()
        sweep, entry = queue.pop(0)
        started = _start(sweep, entry, envs[id(sweep)])
        if started is None:
          if entry["name"] not in waiting:
            logging.info("%s is being run by another process; waiting for it", entry["name"])
            waiting.add(entry["name"])
          busy.append((sweep, entry))
          continue
        if isinstance(started, _Active):
          active.append(started)
        else:  # finished by another launcher meanwhile
          bar.update(1)
          count += 1
        sweep_manifest.write_manifest(sweep.out_dir, sweep.manifest)
      for a in list(active):
        if a.proc.poll() is None:
          continue
        active.remove(a)
        _finish(a, prune)
        sweep_manifest.write_manifest(a.sweep.out_dir, a.sweep.manifest)
        bar.update(1)
        count += 1
        tqdm.tqdm.write(_finish_line(a.entry, count, total))
      if busy and not queue:
        queue, busy = busy, []  # held by another launcher: try again after a pause
        if not active:
          time.sleep(max(poll_s, 2.0))
      time.sleep(poll_s)
  except (KeyboardInterrupt, Interrupted) as e:
    logging.warning("interrupted (%s): stopping %d running run(s); rerun the same command "
                    "to resume", e or "SIGINT", len(active))
    for a in active:
      a.proc.terminate()
    for a in active:
      try:
        a.proc.wait(timeout=STOP_GRACE_S)
      except subprocess.TimeoutExpired:
        a.proc.kill()
        a.proc.wait()
      a.entry.update(state=PENDING, returncode=a.proc.returncode,
                     wall_s=round(time.time() - a.start, 1))
      a.log.close()
      a.lock.close()
    for s in sweeps:
      sweep_manifest.write_manifest(s.out_dir, s.manifest)
    raise
  finally:
    bar.close()
    for signum, handler in previous_handlers.items():
      signal.signal(signum, handler)


def _keep_the_last_checkpoint_unless_running(workdir: str) -> None:
  """`_keep_the_last_checkpoint` if no process holds the run (one that does may still be
  writing its last checkpoint)."""
  lock = _try_lock(workdir)
  if lock is not None:
    try:
      _keep_the_last_checkpoint(workdir)
    finally:
      lock.close()


def _keep_the_last_checkpoint(workdir: str) -> None:
  removed, kept = run_dir.keep_the_last_checkpoint(workdir)
  if removed:
    logging.info("%s: finished; removed its checkpoints of steps %s, kept step %d",
                 os.path.basename(workdir), ", ".join(map(str, removed)), kept)


def _start(sweep: LocalSweep, entry: dict[str, Any], env: dict[str, str]
           ) -> _Active | dict[str, Any] | None:
  """Starts one run of `sweep`; None if another process holds it, the entry if it is
  finished."""
  out_dir = sweep.out_dir
  workdir = sweep_layout.run_dir_of(out_dir, entry["name"])
  lock = _try_lock(workdir)
  if lock is None:
    return None
  final = sweep_manifest.final_metrics(workdir, entry["num_steps"])
  if final is not None:
    lock.close()
    _done_elsewhere(entry, workdir, final)
    return entry
  entry["attempts"] = entry.get("attempts", 0) + 1
  cmd = main_command(os.path.join(out_dir, entry["plan"]), workdir,
                     allow_changed=entry.get("allow_changed", ()))
  log = open(os.path.join(workdir, LOG_FILE), "a")
  log.write(f"=== attempt {entry['attempts']} at {time.strftime('%Y-%m-%dT%H:%M:%S')}: "
            f"{' '.join(cmd)}\n")
  log.flush()
  # The run's process inherits the lock, so it stays locked until that process ends
  # even if this launcher is killed.
  proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                          pass_fds=(lock.fileno(),))
  entry.update(state=RUNNING, returncode=None, started=time.strftime("%Y-%m-%dT%H:%M:%S"),
               pid=proc.pid)
  return _Active(sweep, entry, proc, lock, log, time.time())


def _done_elsewhere(entry: dict[str, Any], workdir: str, final: dict[str, Any]) -> None:
  """`entry` for a run another process finished: done, no pid, its wall seconds from its
  last line (`wall_s`, the run's own clock) and when its metrics were last written."""
  last = run_dir.last_metrics(workdir) or {}
  finished = time.strftime("%Y-%m-%dT%H:%M:%S",
                           time.localtime(os.path.getmtime(run_dir.metrics_path(workdir))))
  entry.update(state=DONE, final=final, pid=None, returncode=0, error=None,
               wall_s=last.get(run_dir.WALL_S), finished=finished)


def _finish(a: _Active, prune: bool = False) -> None:
  out_dir, entry, code = a.sweep.out_dir, a.entry, a.proc.returncode
  a.log.close()
  workdir = sweep_layout.run_dir_of(out_dir, entry["name"])
  final = sweep_manifest.final_metrics(workdir, entry["num_steps"])
  if prune and code == 0 and final is not None:
    _keep_the_last_checkpoint(workdir)  # under the run's lock, which is still held
  a.lock.close()
  entry.update(returncode=code, wall_s=round(time.time() - a.start, 1), pid=None,
               finished=time.strftime("%Y-%m-%dT%H:%M:%S"))
  if code == 0 and final is not None:
    entry.update(state=DONE, final=final, error=None)
  elif code == 0 and _preempted(workdir):
    entry.update(state=PENDING, final=None, error=None)
  else:
    log_path = os.path.join(workdir, LOG_FILE)
    reason = (f"exit status {code}" if code else
              "exit status 0 but metrics.jsonl does not reach num_steps")
    entry.update(state=FAILED, final=None, error=f"{reason}; log {log_path}:\n" +
                 _log_tail(log_path))


def _preempted(workdir: str) -> bool:
  """The run's last line is a preemption event: the line a run writes last when it
  stops on a preemption notice, after saving its step."""
  try:
    last = run_dir.last_line(workdir)
  except run_dir.RunFormatError:
    return False
  return last is not None and last.get(run_dir.EVENT) == metrics.EVENT_PREEMPTED


def _finish_line(entry: dict[str, Any], count: int, total: int) -> str:
  head = f"[{count}/{total}] {entry['name']} {entry['state']} in {entry['wall_s']:.1f} s"
  if entry["state"] == DONE:
    return f"{head}: {sweep_manifest.format_final(entry['final'])}"
  if entry["state"] == PENDING:
    return f"{head}: preempted; the next launch resumes it"
  return f"{head} (exit status {entry['returncode']}; see {entry['error'].splitlines()[0]})"
