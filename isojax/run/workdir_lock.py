"""One writer per workdir: a run holds its workdir from start to exit.

Two processes writing one workdir (a requeued job while the first still runs) would
interleave metrics.jsonl and checkpoints and both exit 0. `hold` makes the second fail
at once, naming the holder (host, pid, start time):

  local paths   an exclusive `fcntl.flock` on `<workdir>/run.lock`, which also holds the
                owner and a heartbeat renewed every `lease_s / 3` seconds. The kernel
                drops the lock when the process ends however it ends (exit, SIGKILL, a
                crash), so on one machine a held lock means a live holder; on a network
                filesystem whose locks outlive a lost machine, `force` takes it over.
  gs://, s3://  object stores have no locks: a lease object `<workdir>/run_lease.json`
                with the owner and a heartbeat the holder renews every `lease_s / 3`
                seconds. A lease not renewed for `lease_s` seconds (its run crashed)
                is taken over. The heartbeat is the holder's clock: hosts' clocks must
                agree to well within `lease_s`.

`force` (`--force_unlock`) never takes a workdir from a live run: a holder on this host
(the same kernel and pid namespace) is alive while its pid runs with the start time it
recorded (a reused pid is not the holder); a holder elsewhere is alive while its
heartbeat is younger than `lease_s`. A refusal names the holder and how to stop it.

The sweep runner's own `.lock` (which launcher is responsible for a run) is separate.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator, NoReturn

from absl import logging

from isojax import storage

LOCK_FILE = "run.lock"
LEASE_FILE = "run_lease.json"
LEASE_S = 120.0


class WorkdirLocked(RuntimeError):
  """Another run holds the workdir."""


def _read_text(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None


def pid_space() -> str:
  """Which processes a pid names here: the kernel's boot id and the pid namespace.

  Two holders with the same `pid_space` can check each other's pid; a container on the
  same machine under its own namespace (or another machine) cannot. Empty off Linux.
  """
  boot = (_read_text("/proc/sys/kernel/random/boot_id") or "").strip()
  try:
    namespace = os.readlink("/proc/self/ns/pid")
  except OSError:
    namespace = ""
  return f"{boot}/{namespace}" if boot and namespace else ""


def process_start(pid: int) -> tuple[int, str] | None:
  """(start time in clock ticks after boot, state letter) of `pid` from /proc; None if
  the process does not exist or /proc cannot say."""
  text = _read_text(f"/proc/{pid}/stat")
  if text is None:
    return None
  fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) ", comm may hold spaces
  try:
    return int(fields[19]), fields[0]  # stat fields 22 (starttime) and 3 (state)
  except (IndexError, ValueError):
    return None


@dataclasses.dataclass(frozen=True)
class Owner:
  """Who holds a workdir."""
  host: str
  pid: int
  started: str  # ISO 8601, the holder's clock
  token: str    # unique per holder
  heartbeat: float = 0.0  # time.time() of the last renewal
  pid_start: int = 0      # the pid's start time in clock ticks after boot; 0 if unknown
  pid_space: str = ""     # `pid_space()` of the holder; "" if unknown

  @classmethod
  def me(cls) -> "Owner":
    start = process_start(os.getpid())
    return cls(socket.gethostname(), os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               uuid.uuid4().hex, time.time(), start[0] if start else 0, pid_space())

  @classmethod
  def parse(cls, text: str) -> "Owner | None":
    try:
      fields = json.loads(text)
      return cls(**{f.name: fields[f.name] for f in dataclasses.fields(cls)
                    if f.name in fields})
    except (ValueError, TypeError, KeyError):
      return None  # empty (released) or written by something else

  def describe(self) -> str:
    return f"host {self.host}, pid {self.pid}, started {self.started}"

  def renewed(self) -> "Owner":
    return dataclasses.replace(self, heartbeat=time.time())


def _same_pid_space(owner: Owner) -> bool:
  """Whether `owner.pid` names a process this one can look up."""
  if owner.pid_space and pid_space():
    return owner.pid_space == pid_space()
  return owner.host == socket.gethostname()  # a holder that did not record its space


def _pid_runs(owner: Owner) -> bool:
  """Whether the holder's process (in this pid space) still runs: its pid exists, is
  not a zombie, and started when the holder recorded (else the pid was reused)."""
  if owner.pid <= 0:
    return False  # names no process (and kill(0 or -1) would mean groups)
  try:
    os.kill(owner.pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass  # another user's process: it exists
  start = process_start(owner.pid)
  if start is None:
    return True  # no /proc: the pid exists, which is all there is to go on
  ticks, state = start
  return state not in ("Z", "X") and (not owner.pid_start or ticks == owner.pid_start)


@dataclasses.dataclass(frozen=True)
class Liveness:
  """Whether a holder may still be running, and the evidence, for messages."""
  alive: bool
  evidence: str


def liveness(owner: Owner | None, lease_s: float) -> Liveness:
  """A holder on this host is judged by its pid, one elsewhere by its heartbeat."""
  if owner is None:
    return Liveness(True, "it recorded no owner, so it may be alive (delete the file by "
                    "hand if no run uses this workdir)")
  age = time.time() - owner.heartbeat
  if _same_pid_space(owner):
    if _pid_runs(owner):
      return Liveness(True, f"pid {owner.pid} is running on this host")
    return Liveness(False, f"pid {owner.pid} is no longer running on this host")
  if age < lease_s:
    return Liveness(True, f"its heartbeat is {age:.0f} s old; a holder on another host "
                    f"counts as live until its heartbeat is {lease_s:.0f} s old")
  return Liveness(False, f"its heartbeat is {age:.0f} s old (not renewed for over "
                  f"{lease_s:.0f} s)")


@contextlib.contextmanager
def hold(workdir: storage.PathLike, *, force: bool = False,
         lease_s: float = LEASE_S) -> Iterator[Owner]:
  """Holds `workdir` for the body; raises `WorkdirLocked` naming the holder if another
  run has it. `force` takes the workdir from a holder that is gone (say which, in the
  log) and refuses a live one."""
  if storage.is_uri(workdir):
    with _lease(workdir, force, lease_s) as owner:
      yield owner
  else:
    with _flock(os.fspath(storage.path(workdir)), force, lease_s) as owner:
      yield owner


def _held_message(workdir: Any, owner: Owner | None, where: Any, live: Liveness,
                  force: bool) -> str:
  holder = owner.describe() if owner else "an unknown process"
  head = f"--workdir={workdir}: another run holds it ({holder}; {where}): {live.evidence}"
  if not live.alive:
    return f"{head}. That run is gone: pass --force_unlock to take the workdir"
  stop = (f"stop it (`kill -TERM {owner.pid}` on host {owner.host} saves its step and "
          "exits)" if owner else "stop it")
  if force:
    return (f"{head}. --force_unlock never takes a workdir from a live run: {stop}, wait "
            "for it to end, or use another --workdir")
  return (f"{head}. Wait for it to end, {stop}, or use another --workdir; --force_unlock "
          "takes it only from a run that is gone")


def _heartbeat(name: str, lease_s: float, renew: Callable[[], bool]) -> Callable[[], None]:
  """Calls `renew` every `lease_s / 3` seconds on a thread until it returns False or
  the returned `stop` is called."""
  stopped = threading.Event()

  def loop() -> None:
    while not stopped.wait(lease_s / 3) and renew():
      pass

  thread = threading.Thread(target=loop, name=name, daemon=True)
  thread.start()

  def stop() -> None:
    stopped.set()
    thread.join()
  return stop


def _read_owner(fd: int) -> Owner | None:
  """The owner in an open lock file; retried briefly, as a renewal may be mid-write."""
  for _ in range(3):
    owner = Owner.parse(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
    if owner is not None:
      return owner
    time.sleep(0.01)
  return None


def _made_dirs(workdir: str) -> list[str]:
  """Makes `workdir` and its missing parents; those it made, innermost first."""
  made, current = [], os.path.abspath(workdir)
  while not os.path.isdir(current):
    made.append(current)
    current = os.path.dirname(current)
  os.makedirs(workdir, exist_ok=True)
  return made


def _record_failed(path: str, fd: int, made: list[str], needed: int, e: OSError) -> NoReturn:
  """The owner record could not be written (a full disk): the lock file and the
  directories this run made are removed, and the error names the file and the bytes."""
  os.close(fd)
  if made:
    with contextlib.suppress(OSError):
      os.unlink(path)
    for directory in made:
      with contextlib.suppress(OSError):
        os.rmdir(directory)
  if e.errno != errno.ENOSPC:
    raise e
  free = storage.free_bytes(path)
  free_text = f", {free:,} are free there" if free is not None else ""
  removed = f"; {made[-1]} was new and is removed" if made else ""
  raise storage.NoSpace(f"no space left on device writing the workdir lock {path}: it needs "
                        f"{needed:,} bytes{free_text}{removed}") from None


@contextlib.contextmanager
def _flock(workdir: str, force: bool, lease_s: float) -> Iterator[Owner]:
  made = _made_dirs(workdir)
  path = os.path.join(workdir, LOCK_FILE)
  while True:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        os.close(fd)
        raise
      owner = _read_owner(fd)
      os.close(fd)
      live = liveness(owner, lease_s)
      if not force or live.alive:
        raise WorkdirLocked(_held_message(workdir, owner, path, live, force)) from None
      logging.warning("--force_unlock: taking %s from %s (%s)", workdir,
                      owner.describe() if owner else "no recorded holder", live.evidence)
      with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a holder that still runs keeps a lock on the old file only
      continue
    # Locked; but if --force_unlock replaced the file meanwhile, this lock guards nothing.
    if os.path.exists(path) and os.stat(path).st_ino == os.fstat(fd).st_ino:
      break
    os.close(fd)
  owner = Owner.me()
  written = [0]

  def write(record: Owner) -> bool:
    # In place and never shorter (padded with spaces), so a reader sees a whole record.
    text = json.dumps(dataclasses.asdict(record)).ljust(written[0])
    os.pwrite(fd, text.encode(), 0)
    written[0] = len(text)
    return True

  try:
    os.ftruncate(fd, 0)
    write(owner)
  except OSError as e:
    _record_failed(path, fd, made, len(json.dumps(dataclasses.asdict(owner))), e)
  stop = _heartbeat("workdir-lock", lease_s, lambda: write(owner.renewed()))
  try:
    yield owner
  finally:
    stop()
    os.ftruncate(fd, 0)  # released: the file stays, empty
    os.close(fd)


@contextlib.contextmanager
def _lease(workdir: storage.PathLike, force: bool, lease_s: float) -> Iterator[Owner]:
  path = storage.path(workdir) / LEASE_FILE

  def read() -> Owner | None:
    try:
      return Owner.parse(path.read_text())
    except FileNotFoundError:
      return None

  current = read()
  if current is not None:
    age = time.time() - current.heartbeat
    live = liveness(current, lease_s)
    if live.alive or (age < lease_s and not force):
      raise WorkdirLocked(_held_message(workdir, current, path, live, force))
    logging.warning("%s: taking over the lease of %s (%s)%s", workdir, current.describe(),
                    live.evidence, " for --force_unlock" if age < lease_s else "")
  owner = Owner.me()
  storage.write_json(path, dataclasses.asdict(owner))
  winner = read()
  if winner is None or winner.token != owner.token:  # another run wrote in between
    raise WorkdirLocked(_held_message(workdir, winner, path, Liveness(
        True, "it took the lease at the same time as this run"), force))

  def renew() -> bool:
    holder = read()
    if holder is None or holder.token != owner.token:
      logging.error("%s: the lease was taken by %s; this run no longer holds its "
                    "workdir", workdir, holder.describe() if holder else "nobody")
      return False
    storage.write_json(path, dataclasses.asdict(owner.renewed()))
    return True

  stop = _heartbeat("workdir-lease", lease_s, renew)
  try:
    yield owner
  finally:
    stop()
    holder = read()
    if holder is not None and holder.token == owner.token:
      path.unlink()
