"""Math answers graded by `math-verify`, in worker processes with a hard timeout.

Math datasets (GSM8K, MATH, ...) give a gold answer as text ("72", "\\frac{1}{2}") and
reward a completion whose final answer is mathematically equal to it, in whatever form
it is written (`0.5`, `1/2`, `\\dfrac{1}{2}`). `math-verify` does that comparison with
SymPy, which on a pathological expression (a huge power, a deep nest) can run for
minutes or crash, and its own timeouts use `signal.alarm`, which works only in a main
thread. So `MathVerifier` grades each completion in a pool of worker processes with a
per-completion timeout: a hung worker is killed and replaced, that completion scores 0
and is counted, and the rest of the batch is unaffected. The workers start by
"forkserver" (or "spawn"), never "fork": the parent runs JAX, whose threads make a
forked child unsafe.

A pool that cannot work raises `VerifierPoolError` with the reason, never hangs or
scores zeros: a new pool must answer a ping within `STARTUP_TIMEOUT_S`, a batch that
loses its pool (every worker dead) raises, and a batch not graded within its
per-completion timeouts (plus start-up) raises. The usual cause is a script that
grades without an `if __name__ == "__main__":` guard: forkserver and spawn workers
re-import the caller's main module, which then starts grading again inside them.

The final answer is the content of the last `\\boxed{...}` in a completion, or the
capture group of a caller's regex (`<answer>(.*?)</answer>`); no answer scores 0.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
import multiprocessing
import os
import re
import threading
from typing import Callable, Sequence

import math_verify
import numpy as np
import pebble

from isojax.tasks import problem as problem_lib

# `\boxed{`, `\boxed {` and `\fbox{`: the openings of a final-answer box.
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")

# LaTeX first: it reads `\frac`, `\sqrt`, `\pi`, intervals, sets, `\text{ cm}` and `\$`,
# none of which the plain-expression reader knows. The plain reader then catches text
# the LaTeX reader rejects.
_LATEX = (math_verify.LatexExtractionConfig(),)
_EXPR = (math_verify.ExprExtractionConfig(),)

# math-verify's own per-call limits (whole seconds: they are `signal.alarm`s). The
# pool's timeout is the hard guarantee; these only let a slow SymPy call give up early.
_SIGNAL_TIMEOUT_S = 5

_START_METHODS = ("forkserver", "spawn")  # in order of preference; never "fork"
# A new pool's workers must answer within this; a batch may take its per-completion
# timeouts (in rounds of `workers`) plus this.
STARTUP_TIMEOUT_S = 30.0
_GUARD_HINT = ("workers started by forkserver or spawn re-import the main module, so a "
               "script that grades must keep its work under "
               "`if __name__ == \"__main__\":`")


class VerifierPoolError(RuntimeError):
  """The grading pool cannot grade: it did not start, lost every worker, or stalled."""


# --------------------------------------------------------------------------- parsing


def _signal_timeout() -> int | None:
  """math-verify's alarm-based timeout, or None where signals cannot be used.

  `signal.signal` raises outside the main thread, so a loader thread or a test
  calling `parse_gold` there parses without a limit rather than failing.
  """
  if threading.current_thread() is threading.main_thread():
    return _SIGNAL_TIMEOUT_S
  return None


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple:
  """math-verify's parse of one answer (no surrounding prose); () if unparseable.

  Cached: a worker sees the same gold for every rollout of a problem, and a group of
  rollouts often repeats the same final answer. A tuple, so callers cannot mutate the
  cached value.
  """
  text = text.strip()
  if not text:
    return ()
  timeout = _signal_timeout()
  # Wrapped in `$...$` so the LaTeX reader treats the whole text as math; a gold that
  # already carries dollars ("$5$") becomes "$$5$$", which it also reads.
  parsed = math_verify.parse(f"${text}$", _LATEX, fallback_mode="no_fallback",
                             parsing_timeout=timeout)
  if not parsed:
    parsed = math_verify.parse(text, _EXPR, fallback_mode="no_fallback",
                               parsing_timeout=timeout)
  return tuple(parsed)


def parse_gold(text: str) -> list | None:
  """The gold answer as math-verify's parsed list, or None if it cannot be parsed.

  Dataset loaders call this to drop rows whose gold answer could never be matched.
  """
  parsed = _parse(text)
  return list(parsed) if parsed else None


# ------------------------------------------------------------------------ extraction


def _box_end(text: str, start: int) -> int | None:
  """Index of the `}` closing the brace opened just before `start`; None if unclosed.

  Escaped braces (`\\{1, 2\\}`, a set) do not count towards the balance.
  """
  depth, i = 1, start
  while i < len(text):
    c = text[i]
    if c == "\\" and text[i + 1:i + 2] in ("{", "}"):
      i += 2
      continue
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return i
    i += 1
  return None


def _last_box(text: str) -> str | None:
  """Content of the last complete, outermost `\\boxed{...}` or `\\fbox{...}`."""
  content, covered_to = None, -1
  for m in _BOX_OPEN.finditer(text):
    if m.start() < covered_to:
      continue  # a box nested inside the one already found: the outer one counts
    end = _box_end(text, m.end())
    if end is None:
      continue  # cut off mid-box (a truncated completion): not an answer
    content, covered_to = text[m.end():end], end
  return content


def _check_pattern(pattern: str) -> None:
  if pattern and re.compile(pattern).groups != 1:
    raise ValueError(f"pattern={pattern!r}: expected a regex with exactly one capture "
                     "group (the answer), e.g. '<answer>(.*?)</answer>'")


def extract_answer(completion: str, pattern: str = "") -> str | None:
  """The completion's final answer, stripped; None if there is none (or it is empty).

  With an empty `pattern`, the content of the last `\\boxed{...}` (or `\\fbox{...}`),
  nested braces included. Otherwise group 1 of the last match of the regex `pattern`
  (`re.DOTALL`, so an answer may span lines).
  """
  if pattern:
    _check_pattern(pattern)
    matches = list(re.finditer(pattern, completion, re.DOTALL))
    answer = matches[-1].group(1) if matches else None
  else:
    answer = _last_box(completion)
  if answer is None or not answer.strip():
    return None
  return answer.strip()


# --------------------------------------------------------------------------- grading


def grade_one(completion: str, gold: str, pattern: str = "") -> float:
  """1.0 iff the completion's final answer equals `gold` by math-verify, else 0.0.

  Pure and deterministic. Raises (ValueError) when `gold` cannot be parsed or
  `pattern` is malformed, and lets math-verify's rare internal errors propagate:
  `MathVerifier` counts a raise as an error and scores it 0, which keeps a broken
  gold visible in the metrics instead of silently scoring every rollout 0.
  """
  answer = extract_answer(completion, pattern)
  if answer is None:
    return 0.0
  gold_parsed = _parse(gold)
  if not gold_parsed:
    raise ValueError(f"gold answer {gold!r}: math-verify cannot parse it; drop the row "
                     "(see parse_gold)")
  answer_parsed = _parse(answer)
  if not answer_parsed:
    return 0.0
  ok = math_verify.verify(list(gold_parsed), list(answer_parsed),
                          timeout_seconds=_signal_timeout())
  return 1.0 if ok else 0.0


def _start_context():
  available = multiprocessing.get_all_start_methods()
  method = next(m for m in _START_METHODS if m in available)
  return multiprocessing.get_context(method)


def _ready() -> int:
  """What a new pool's workers answer to show they started (and imported this module)."""
  return os.getpid()


def _collect(futures: Sequence[concurrent.futures.Future]) -> problem_lib.Grades:
  """Grades from finished per-completion futures: timeouts and raises score 0; a pool
  that broke (every worker gone) raises `VerifierPoolError` instead."""
  rewards_B = np.zeros(len(futures), np.float32)
  timeouts = errors = 0
  for i, future in enumerate(futures):
    try:
      reward = float(future.result())
    except TimeoutError:  # pebble killed the worker after timeout_s
      timeouts += 1
      continue
    except concurrent.futures.process.BrokenProcessPool as e:
      raise VerifierPoolError(f"the math grading pool broke ({e!r}); {_GUARD_HINT}") from e
    except Exception as e:  # pylint: disable=broad-except  # incl. ProcessExpired, cancel
      errors += 1
      if errors == 1:  # one line per batch is enough to diagnose, not a flood
        logging.warning("math grading raised: %r", e)
      continue
    if not 0.0 <= reward <= 1.0:  # also rejects NaN
      errors += 1
      continue
    rewards_B[i] = reward
  return problem_lib.Grades(rewards_B, timeouts=timeouts, errors=errors)


class MathVerifier(problem_lib.Verifier):
  """Grades math completions in a lazily started, reused pool of worker processes.

  `grade_fn(completion, gold, pattern) -> float` must be a module-level function (it
  is pickled to the workers); tests inject ones that hang or raise.
  """

  def __init__(self, *, pattern: str = "", timeout_s: float = 5.0, workers: int = 0,
               grade_fn: Callable[[str, str, str], float] = grade_one):
    _check_pattern(pattern)  # fail here, not once per completion inside the workers
    if not timeout_s > 0:
      raise ValueError(f"timeout_s={timeout_s}: expected a positive number of seconds")
    if workers < 0:
      raise ValueError(f"workers={workers}: expected >= 0 (0 means min(4, cpu count))")
    self.pattern = pattern
    self.timeout_s = float(timeout_s)
    self.workers = workers or min(4, os.cpu_count() or 1)
    self.grade_fn = grade_fn
    self._pool: pebble.ProcessPool | None = None
    self._lock = threading.Lock()

  def _get_pool(self) -> pebble.ProcessPool:
    """The pool, started on first use and checked: its workers must answer a ping."""
    with self._lock:
      if self._pool is None:
        context = _start_context()
        pool = pebble.ProcessPool(max_workers=self.workers, context=context)
        try:
          pool.schedule(_ready).result(timeout=STARTUP_TIMEOUT_S)
        except BaseException as e:  # pylint: disable=broad-except  # any failure: say why
          pool.stop()
          pool.join()
          reason = (f"no answer within {STARTUP_TIMEOUT_S:.0f} s" if isinstance(
              e, concurrent.futures.TimeoutError) else repr(e))
          raise VerifierPoolError(
              f"the math grading pool ({self.workers} {context.get_start_method()} "
              f"workers) did not start: {reason}; {_GUARD_HINT}") from e
        self._pool = pool
      return self._pool

  def _deadline_s(self, count: int) -> float:
    """How long `count` completions may take: every timeout in rounds of `workers`."""
    return self.timeout_s * math.ceil(count / self.workers) + STARTUP_TIMEOUT_S

  def grade_async(self, completions: Sequence[str],
                  problems: Sequence[problem_lib.Problem]) -> concurrent.futures.Future:
    """A future of the batch's `Grades`; every completion is queued before returning."""
    if len(completions) != len(problems):
      raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    result: concurrent.futures.Future = concurrent.futures.Future()
    if not completions:
      result.set_result(problem_lib.Grades(np.zeros(0, np.float32)))
      return result
    pool = self._get_pool()
    futures = [pool.schedule(self.grade_fn, args=(c, p.answer, self.pattern),
                             timeout=self.timeout_s)
               for c, p in zip(completions, problems)]
    # The last future to finish assembles the batch, on pebble's result thread: nothing
    # blocks the caller. A timer fails the batch if the pool stalls past its deadline.
    remaining, lock = [len(futures)], threading.Lock()
    deadline_s = self._deadline_s(len(futures))

    def settle(set_outcome) -> None:
      with lock:
        if result.done():
          return
        set_outcome()

    def on_done(_):
      with lock:
        remaining[0] -= 1
        last = remaining[0] == 0
      if last:
        timer.cancel()
        try:
          grades = _collect(futures)
        except BaseException as e:  # pylint: disable=broad-except  # surfaced by .result()
          error = e
          settle(lambda: result.set_exception(error))
          self.close()  # a broken pool: the next batch starts (and checks) a new one
          return
        settle(lambda: result.set_result(grades))

    def on_deadline():
      settle(lambda: result.set_exception(VerifierPoolError(
          f"grading {len(futures)} completions did not finish within {deadline_s:.0f} s "
          f"({self.timeout_s:g} s each on {self.workers} workers, plus "
          f"{STARTUP_TIMEOUT_S:.0f} s): the pool stalled; {_GUARD_HINT}")))
      for future in futures:
        future.cancel()
      threading.Thread(target=self.close, daemon=True).start()

    timer = threading.Timer(deadline_s, on_deadline)
    timer.daemon = True
    timer.start()
    for future in futures:
      future.add_done_callback(on_done)
    return result

  def grade(self, completions: Sequence[str],
            problems: Sequence[problem_lib.Problem]) -> problem_lib.Grades:
    return self.grade_async(completions, problems).result()

  def close(self) -> None:
    """Stops the workers (a hung one included); a later grade starts a new pool."""
    with self._lock:
      pool, self._pool = self._pool, None
    if pool is not None:
      pool.stop()  # not close(): that would wait for hung tasks to time out
      pool.join()

  def __enter__(self) -> MathVerifier:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()
