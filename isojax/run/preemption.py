"""Save on preemption: a SIGTERM ends the run at a step boundary, checkpointed, exit 0.

Cloud TPU VMs, spot GPUs, SLURM (`--signal`) and Kubernetes (`terminationGracePeriodSeconds`)
announce a preemption with a SIGTERM and a grace period. `Notice` turns the signal into
a decision every process takes at the same step boundary:

  one process      a Python SIGTERM handler sets a flag; later signals are logged and
                   otherwise ignored, so a save in progress completes.
  several (jax.distributed)
                   JAX's preemption service catches the SIGTERM of any host and
                   `multihost_utils.reached_preemption_sync_point(step)` answers True on
                   every process at the same step (the mechanism orbax's
                   CheckpointManager uses too). No Python handler is installed: it would
                   take the signal from the service.

`isojax.run.train` asks before and after the step-0 evaluation and at the top of every step;
on True it saves that step (unless the step is saved already, or is step 0 of a fresh
run: then nothing is saved), flushes its writers and raises `Preempted`, which
`isojax.main` turns into exit status 0 and a line saying where the run resumes.
"""

from __future__ import annotations

import signal
import threading

import jax
from absl import logging


class Preempted(Exception):
  """The run stopped at a step boundary on a preemption notice; the message says where a
  rerun resumes."""


class Notice:
  """Whether a preemption notice has arrived, decided at step boundaries.

  A context manager: the SIGTERM handler (one process) is installed on entry and the
  previous one restored on exit. Outside the main thread (a run started from a worker
  thread) no handler can be installed; the notice then never arrives.

  The handler only counts: a signal handler runs between two bytecodes of whatever the
  main thread was doing, and writing a log line there can re-enter a stream that line
  was already writing to (Python raises "reentrant call" at that arbitrary point). A
  daemon thread logs each signal as it arrives instead.
  """

  def __init__(self):
    self._received = threading.Event()
    self._signals: list[int] = []   # signal numbers, in arrival order
    self._wake = threading.Event()  # new signals to log, or exit
    self._closed = False
    self._previous = None
    self._reporter: threading.Thread | None = None
    self._multihost = jax.process_count() > 1

  def __enter__(self) -> "Notice":
    if not self._multihost and threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_signal)
      self._reporter = threading.Thread(target=self._report, name="isojax-preemption-log",
                                        daemon=True)
      self._reporter.start()
    return self

  def __exit__(self, *exc) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None
    if self._reporter is not None:
      self._closed = True
      self._wake.set()
      self._reporter.join()  # every signal received is logged before the run returns
      self._reporter = None

  def _on_signal(self, signum, frame) -> None:
    del frame
    self._signals.append(signum)
    self._received.set()
    self._wake.set()

  def _report(self) -> None:
    logged = 0
    while True:
      self._wake.wait()
      self._wake.clear()
      while logged < len(self._signals):
        name = signal.Signals(self._signals[logged]).name
        if logged == 0:
          logging.warning("%s: the run stops after this step and saves it", name)
        else:
          logging.warning("%s again: still finishing the step and saving it", name)
        logged += 1
      if self._closed:
        return

  def reached(self, step: int) -> bool:
    """True when the run should stop before `step`; every process calls it with the same
    non-decreasing `step`s (step 0 twice: before and after the first evaluation) and gets
    the same answer."""
    if self._multihost:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      return multihost_utils.reached_preemption_sync_point(step)
    return self._received.is_set()
