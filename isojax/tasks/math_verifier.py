"""Math answers graded by `math-verify`, in worker processes with a hard timeout.

Math datasets (GSM8K, MATH, ...) give a gold answer as text ("72", "\\frac{1}{2}") and
reward a completion whose final answer is mathematically equal to it, in whatever form
it is written (`0.5`, `1/2`, `\\dfrac{1}{2}`). `math-verify` does that comparison with
SymPy, which on a pathological expression (a huge power such as `9^{9^{9^{9}}}`, a deep
nest) can run for minutes or crash, and its own timeouts use `signal.alarm`, which works
only in a main thread. So `MathVerifier` grades each completion in a pool of worker
processes with a per-completion timeout. The workers start by "forkserver" (or
"spawn"), never "fork": the parent runs JAX, whose threads make a forked child unsafe.

Grading never ends a run. A completion whose grading times out scores 0 and is counted
(`Grades.timeouts`), whether the pool killed its worker or math-verify's own alarm
gave up first; one that raises scores 0 and counts as an error. A batch still
unfinished at its deadline (every timeout, in rounds of the workers, plus start-up)
scores the completions still pending as timeouts, replaces the stuck workers and
returns. A batch with many timeouts is logged as a warning, with one example clipped
to a few hundred characters: a completion or an expression can be 200 KB.

Only a pool that cannot start raises (`VerifierPoolError`): its workers must answer a
ping within `STARTUP_TIMEOUT_S`. The error names the cause when the main module is it:
forkserver and spawn workers re-run the caller's main script, so a script that grades
without an `if __name__ == "__main__":` guard starts grading again inside them, and a
script read from standard input cannot be re-run at all. That last one is known before
any worker starts, so it is refused at once instead of after the start-up timeout.

How one completion is graded (the final answer extracted, parsed and compared) is
`math_grading`; this module is the pool that runs it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import math
import multiprocessing
import os
import re
import sys
import threading
from typing import Callable, Sequence

import numpy as np
import pebble

from isojax.tasks import math_grading
from isojax.tasks import problem as problem_lib


_START_METHODS = ("forkserver", "spawn")  # in order of preference; never "fork"
# A new pool's workers must answer within this; a batch may take its per-completion
# timeouts (in rounds of `workers`) plus this before its pending completions time out.
STARTUP_TIMEOUT_S = 30.0
# A batch with at least this fraction of timeouts is a warning (fewer: an info line).
WARN_TIMEOUT_FRACTION = 0.25

_GUARD_HINT = ("workers started by forkserver or spawn re-import the main module, so a "
               "script that grades must keep its work under "
               "`if __name__ == \"__main__\":`")
_GUARD = re.compile(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:""", re.MULTILINE)


class VerifierPoolError(RuntimeError):
  """The grading pool cannot grade: its workers did not start."""


# ------------------------------------------------------------------------ the workers


def _alarm_s(timeout_s: float) -> int:
  """math-verify's alarm in a worker: whole seconds, under the pool's `timeout_s` where
  it can be, so a slow SymPy call mostly gives up inside a worker that lives on,
  rather than the pool killing the worker and starting another."""
  return max(1, math.ceil(timeout_s) - 1)


def _init_worker(alarm_s: int) -> None:
  """Sets the worker's alarm and warms math-verify up (its parsers build on first use),
  so a new worker's first completion is not timed with that start-up."""
  math_grading.set_alarm_s(alarm_s)
  try:
    math_grading.grade_one("\\boxed{\\frac{1}{2}}", "0.5")
  except BaseException:  # pylint: disable=broad-except  # a warm-up: the ping reports
    pass


def _start_context():
  available = multiprocessing.get_all_start_methods()
  method = next(m for m in _START_METHODS if m in available)
  context = multiprocessing.get_context(method)
  if method == "forkserver":
    # Workers fork from a server that has imported this module (math-verify, SymPy)
    # once, so one killed by a timeout is replaced at once, not after the seconds of
    # importing them again. (No effect once this process's server runs.)
    context.set_forkserver_preload(["__main__", __name__])
  return context


def _ready() -> int:
  """What a new pool's workers answer to show they started (and imported this module)."""
  return os.getpid()


def _main_path() -> str | None:
  """The absolute path workers re-run as the main script (None: nothing to re-run, as
  for `python -c` or an interactive session)."""
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  path = spec.origin if spec is not None else getattr(main, "__file__", None)
  if path and not os.path.isabs(path):
    path = os.path.join(multiprocessing.process.ORIGINAL_DIR or os.getcwd(), path)
  return path or None


def _main_file_missing(path: str | None) -> str:
  """Why workers cannot re-run a main script at `path` that is not a file ("" when it
  is one, or when there is none to re-run)."""
  if not path or os.path.isfile(path):
    return ""
  source = ("standard input (`python -`)" if os.path.basename(path) == "<stdin>"
            else f"{path}, which is not a file")
  return (f"the main script was read from {source}; forkserver and spawn workers "
          "re-run the main script from its file, so it must be a file: save it to one "
          "and run that")


def main_module_cause() -> str:
  """What the main module has to do with workers that did not start, for the error.

  forkserver and spawn workers re-run the parent's main script (as `__mp_main__`) from
  its file before they serve. A script read from standard input has no file to re-run;
  a script that grades outside an `if __name__ == "__main__":` guard grades again in
  every worker. A guarded script, a module run with -m that is guarded, `python -c` or
  an interactive session is not the cause, and the hint would mislead.
  """
  path = _main_path()
  elsewhere = "the workers' own errors are printed above (stderr)"
  if not path:
    return elsewhere  # nothing for the workers to re-run
  missing = _main_file_missing(path)
  if missing:
    return missing
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      guarded = _GUARD.search(f.read()) is not None
  except OSError:
    return elsewhere
  if guarded:
    return f"the main script {path} is guarded, so not the cause; {elsewhere}"
  return f"the main script {path} has no `__main__` guard: {_GUARD_HINT}"


@dataclasses.dataclass
class _Tally:
  """What a batch's per-completion futures came to."""
  rewards_B: np.ndarray                      # [B] float32
  timeouts: list[int]                        # indices: timed out, scored 0
  pending: list[int]                         # indices still running at the deadline
  errors: list[tuple[int, str]]              # (index, what was raised), scored 0
  broken: bool = False                       # the pool broke: replace it


def _collect(futures: Sequence[concurrent.futures.Future]) -> _Tally:
  """Rewards from the futures: timeouts (the pool's kill, math-verify's alarm or a
  future still pending at the deadline) and raises score 0 and are listed."""
  tally = _Tally(np.zeros(len(futures), np.float32), [], [], [])
  for i, future in enumerate(futures):
    if not future.done():
      tally.pending.append(i)
      tally.timeouts.append(i)
      continue
    try:
      reward = float(future.result())
    except TimeoutError:  # pebble killed the worker after timeout_s; GradingTimeout
      tally.timeouts.append(i)
      continue
    except concurrent.futures.process.BrokenProcessPool as e:
      tally.broken = True
      tally.errors.append((i, repr(e)))
      continue
    except Exception as e:  # pylint: disable=broad-except  # incl. ProcessExpired, cancel
      tally.errors.append((i, repr(e)))
      continue
    if not 0.0 <= reward <= 1.0:  # also rejects NaN
      tally.errors.append((i, f"reward {reward!r} outside [0, 1]"))
      continue
    tally.rewards_B[i] = reward
  return tally


def _stop(pool: pebble.ProcessPool) -> None:
  pool.stop()  # not close(): that would wait for hung tasks to time out
  pool.join()


class MathVerifier(problem_lib.Verifier):
  """Grades math completions in a lazily started, reused pool of worker processes.

  `grade_fn(completion, gold, pattern) -> float` must be a module-level function (it
  is pickled to the workers); tests inject ones that hang or raise.
  """

  def __init__(self, *, pattern: str = "", timeout_s: float = 5.0, workers: int = 0,
               grade_fn: Callable[[str, str, str], float] = math_grading.grade_one):
    math_grading.check_pattern(pattern)  # fail here, not once per completion inside the workers
    if not timeout_s > 0:
      raise ValueError(f"timeout_s={timeout_s}: expected a positive number of seconds")
    if workers < 0:
      raise ValueError(f"workers={workers}: expected >= 0 (0 means min(4, cpu count))")
    self.pattern = pattern
    self.timeout_s = float(timeout_s)
    self.workers = workers or min(4, os.cpu_count() or 1)
    self.grade_fn = grade_fn
    self._pool: pebble.ProcessPool | None = None
    self._started = False  # a pool of this verifier has answered its ping
    self._lock = threading.Lock()

  def _get_pool(self) -> pebble.ProcessPool:
    """The pool, started on first use and checked: its workers must answer a ping."""
    with self._lock:
      if self._pool is None:
        context = _start_context()
        missing = _main_file_missing(_main_path())
        if missing:  # every worker would fail to start: say so now, not after a timeout
          raise VerifierPoolError(
              f"the math grading pool ({self.workers} {context.get_start_method()} "
              f"workers) cannot start: {missing}")
        pool = pebble.ProcessPool(max_workers=self.workers, context=context,
                                  initializer=_init_worker,
                                  initargs=(_alarm_s(self.timeout_s),))
        try:
          pool.schedule(_ready).result(timeout=STARTUP_TIMEOUT_S)
        except BaseException as e:  # pylint: disable=broad-except  # any failure: say why
          pool.stop()
          pool.join()
          reason = (f"no answer within {STARTUP_TIMEOUT_S:.0f} s" if isinstance(
              e, concurrent.futures.TimeoutError) else math_grading.clip(repr(e)))
          raise VerifierPoolError(
              f"the math grading pool ({self.workers} {context.get_start_method()} "
              f"workers) did not start: {reason}; {main_module_cause()}") from e
        self._pool, self._started = pool, True
      return self._pool

  def _deadline_s(self, count: int) -> float:
    """How long `count` completions may take: every timeout in rounds of `workers`."""
    return self.timeout_s * math.ceil(count / self.workers) + STARTUP_TIMEOUT_S

  def grade_async(self, completions: Sequence[str],
                  problems: Sequence[problem_lib.Problem]) -> concurrent.futures.Future:
    """A future of the batch's `Grades`; every completion is queued before returning.

    It raises only if this verifier's first pool cannot start. A batch past its
    deadline completes with its pending completions as timeouts; a replacement pool
    that does not start scores its batch 0 as errors, and the next batch tries again.
    """
    if len(completions) != len(problems):
      raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    result: concurrent.futures.Future = concurrent.futures.Future()
    if not completions:
      result.set_result(problem_lib.Grades(np.zeros(0, np.float32)))
      return result
    try:
      pool = self._get_pool()
    except VerifierPoolError as e:
      if not self._started:
        raise  # a setup that never worked: say why, now
      logging.warning("math grading: %s; the batch of %d scores 0 as errors, and the next "
                      "batch starts a pool again", e, len(completions))
      result.set_result(problem_lib.Grades(np.zeros(len(completions), np.float32),
                                           errors=len(completions)))
      return result
    futures = [pool.schedule(self.grade_fn, args=(c, p.answer, self.pattern),
                             timeout=self.timeout_s)
               for c, p in zip(completions, problems)]
    # The last future to finish assembles the batch, on pebble's result thread: nothing
    # blocks the caller. A timer assembles it at the deadline if the pool is stuck.
    remaining, lock = [len(futures)], threading.Lock()
    deadline_s = self._deadline_s(len(futures))

    def finish() -> None:
      with lock:
        if result.done():
          return
        try:
          tally = _collect(futures)
          grades = self._report(tally, completions, problems, deadline_s)
        except BaseException as e:  # pylint: disable=broad-except  # surfaced by .result()
          result.set_exception(e)
          return
        if tally.pending or tally.broken:  # stuck or lost workers: the next batch gets new
          self._detach(pool)  # before the caller can see the result and grade again
          threading.Thread(target=_stop, args=(pool,), daemon=True).start()
        result.set_result(grades)
      for i in tally.pending:
        futures[i].cancel()

    def on_done(_):
      with lock:
        remaining[0] -= 1
        last = remaining[0] == 0
      if last:
        timer.cancel()
        finish()

    timer = threading.Timer(deadline_s, finish)
    timer.daemon = True
    timer.start()
    for future in futures:
      future.add_done_callback(on_done)
    return result

  def _report(self, tally: _Tally, completions: Sequence[str],
              problems: Sequence[problem_lib.Problem], deadline_s: float
              ) -> problem_lib.Grades:
    """The batch's `Grades`, logging its timeouts and errors with one clipped example."""
    count = len(completions)
    if tally.pending:
      logging.warning("math grading: the batch of %d passed its deadline of %.0f s with %d "
                      "completions still pending; they score 0 as timeouts and their "
                      "workers are replaced", count, deadline_s, len(tally.pending))
    if tally.timeouts:
      i = tally.timeouts[0]
      answer = math_grading.extract_answer(completions[i], self.pattern) or completions[i]
      high = len(tally.timeouts) >= WARN_TIMEOUT_FRACTION * count
      logging.log(
          logging.WARNING if high else logging.INFO,
          "math grading: %d of %d completions timed out (%g s each; scored 0), e.g. "
          "answer `%s` against gold `%s`%s", len(tally.timeouts), count, self.timeout_s,
          math_grading.clip(answer),
          math_grading.clip(problems[i].answer),
          "; when most time out, the gold answers may be expressions SymPy cannot "
          "evaluate in time: check them, or raise task.verifier_timeout_s" if high else "")
    if tally.errors:
      i, error = tally.errors[0]
      logging.warning("math grading: %d of %d completions raised (scored 0)%s, e.g. %s on "
                      "gold `%s`", len(tally.errors), count,
                      "; the pool broke and is replaced" if tally.broken else "",
                      math_grading.clip(error), math_grading.clip(problems[i].answer))
    return problem_lib.Grades(tally.rewards_B, timeouts=len(tally.timeouts),
                              errors=len(tally.errors))

  def grade(self, completions: Sequence[str],
            problems: Sequence[problem_lib.Problem]) -> problem_lib.Grades:
    return self.grade_async(completions, problems).result()

  def _detach(self, pool: pebble.ProcessPool) -> None:
    """Makes the next grade start a new pool instead of `pool`."""
    with self._lock:
      if self._pool is pool:
        self._pool = None

  def close(self) -> None:
    """Stops the workers (a hung one included); a later grade starts a new pool."""
    pool = self._pool
    if pool is not None:
      self._detach(pool)
      _stop(pool)

  def __enter__(self) -> MathVerifier:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
