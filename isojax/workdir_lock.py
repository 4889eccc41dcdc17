"""One writer per workdir: a run holds its workdir from start to exit.

Two processes writing one workdir (a requeued job while the first still runs) would
interleave metrics.jsonl and checkpoints and both exit 0. `hold` makes the second fail
at once, naming the holder (host, pid, start time):

  local paths   an exclusive `fcntl.flock` on `<workdir>/run.lock`, which also holds the
                owner. The kernel drops the lock when the process ends however it ends
                (exit, SIGKILL, a crash), so a local lock is never stale; on a network
                filesystem whose locks outlive a lost machine, `force` takes it over.
  gs://, s3://  object stores have no locks: a lease object `<workdir>/run_lease.json`
                with the owner and a heartbeat the holder renews every `lease_s / 3`
                seconds. A lease not renewed for `lease_s` seconds (its run crashed)
                is taken over; `force` takes over a live one. The heartbeat is the
                holder's clock: hosts' clocks must agree to well within `lease_s`.

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
from typing import Any, Iterator

from absl import logging

from isojax import storage

LOCK_FILE = "run.lock"
LEASE_FILE = "run_lease.json"
LEASE_S = 120.0


class WorkdirLocked(RuntimeError):
  """Another run holds the workdir."""


@dataclasses.dataclass(frozen=True)
class Owner:
  """Who holds a workdir."""
  host: str
  pid: int
  started: str  # ISO 8601, the holder's clock
  token: str    # unique per holder
  heartbeat: float = 0.0  # leases: time.time() of the last renewal

  @classmethod
  def me(cls) -> "Owner":
    return cls(socket.gethostname(), os.getpid(), time.strftime("%Y-%m-%dT%H:%M:%S%z"),
               uuid.uuid4().hex, time.time())

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


@contextlib.contextmanager
def hold(workdir: storage.PathLike, *, force: bool = False,
         lease_s: float = LEASE_S) -> Iterator[Owner]:
  """Holds `workdir` for the body; raises `WorkdirLocked` naming the holder if another
  run has it. `force` takes the workdir from its holder (say which, in the log)."""
  if storage.is_uri(workdir):
    with _lease(workdir, force, lease_s) as owner:
      yield owner
  else:
    with _flock(os.fspath(storage.path(workdir)), force) as owner:
      yield owner


def _held_message(workdir: Any, owner: Owner | None, where: Any, extra: str = "") -> str:
  holder = owner.describe() if owner else "an unknown process"
  return (f"--workdir={workdir}: another run holds it ({holder}; {where}){extra}. Wait "
          "for it to end, use another --workdir, or, if that run is gone, pass "
          "--force_unlock")


@contextlib.contextmanager
def _flock(workdir: str, force: bool) -> Iterator[Owner]:
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  if force and os.path.exists(path):
    with open(path) as f:
      previous = Owner.parse(f.read())
    logging.warning("--force_unlock: taking %s from %s", workdir,
                    previous.describe() if previous else "no recorded holder")
    os.unlink(path)  # a holder that still runs keeps a lock on the old file only
  while True:
    f = open(path, "a+")
    try:
      fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      f.seek(0)
      owner = Owner.parse(f.read())
      f.close()
      if e.errno in (errno.EAGAIN, errno.EACCES):
        raise WorkdirLocked(_held_message(workdir, owner, path)) from None
      raise
    # Locked; but if --force_unlock replaced the file meanwhile, this lock guards nothing.
    if os.path.exists(path) and os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
      break
    f.close()
  owner = Owner.me()
  f.seek(0)
  f.truncate()
  f.write(json.dumps(dataclasses.asdict(owner)))
  f.flush()
  try:
    yield owner
  finally:
    f.truncate(0)  # released: the file stays, empty
    f.close()


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
    if force:
      logging.warning("--force_unlock: taking %s from %s (renewed %.0f s ago)", workdir,
                      current.describe(), age)
    elif age < lease_s:
      raise WorkdirLocked(_held_message(
          workdir, current, path, f"; its lease was renewed {age:.0f} s ago and expires "
          f"{lease_s - age:.0f} s after its last renewal"))
    else:
      logging.warning("%s: taking over the expired lease of %s (not renewed for %.0f s)",
                      workdir, current.describe(), age)
  owner = Owner.me()
  storage.write_json(path, dataclasses.asdict(owner))
  winner = read()
  if winner is None or winner.token != owner.token:  # another run wrote in between
    raise WorkdirLocked(_held_message(workdir, winner, path))
  stop = threading.Event()

  def renew() -> None:
    while not stop.wait(lease_s / 3):
      holder = read()
      if holder is None or holder.token != owner.token:
        logging.error("%s: the lease was taken by %s; this run no longer holds its "
                      "workdir", workdir, holder.describe() if holder else "nobody")
        return
      storage.write_json(path, dict(dataclasses.asdict(owner), heartbeat=time.time()))

  thread = threading.Thread(target=renew, name="workdir-lease", daemon=True)
  thread.start()
  try:
    yield owner
  finally:
    stop.set()
    thread.join()
    holder = read()
    if holder is not None and holder.token == owner.token:
      path.unlink()
