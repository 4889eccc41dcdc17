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
script read from standard input cannot be re-run at all.

The final answer is the content of the last `\\boxed{...}` in a completion, or the
capture group of a caller's regex (`<answer>(.*?)</answer>`); no answer scores 0.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import itertools
import logging
import math
import multiprocessing
import os
import re
import sys
import threading
from typing import Callable, Sequence

import math_verify
import numpy as np
import pebble
from math_verify import errors as math_verify_errors

from isojax.tasks import problem as problem_lib

# `\boxed{`, `\boxed {` and `\fbox{`: the openings of a final-answer box.
_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")

# LaTeX first: it reads `\frac`, `\sqrt`, `\pi`, intervals, sets, `\text{ cm}` and `\$`,
# none of which the plain-expression reader knows. The plain reader then catches text
# the LaTeX reader rejects.
_LATEX = (math_verify.LatexExtractionConfig(),)
_EXPR = (math_verify.ExprExtractionConfig(),)

# math-verify's own per-call limit (whole seconds: a `signal.alarm`) outside the pool.
# In a worker it is `_alarm_s(timeout_s)`, below the pool's timeout where it can be.
_SIGNAL_TIMEOUT_S = 5
_worker_alarm_s: int | None = None  # set in each worker by `_init_worker`

_START_METHODS = ("forkserver", "spawn")  # in order of preference; never "fork"
# A new pool's workers must answer within this; a batch may take its per-completion
# timeouts (in rounds of `workers`) plus this before its pending completions time out.
STARTUP_TIMEOUT_S = 30.0
# A batch with at least this fraction of timeouts is a warning (fewer: an info line).
WARN_TIMEOUT_FRACTION = 0.25
# Log lines show at most this many characters of a completion, answer or expression.
CLIP_CHARS = 200

_GUARD_HINT = ("workers started by forkserver or spawn re-import the main module, so a "
               "script that grades must keep its work under "
               "`if __name__ == \"__main__\":`")
_GUARD = re.compile(r"""^if\s+__name__\s*==\s*["']__main__["']\s*:""", re.MULTILINE)


class VerifierPoolError(RuntimeError):
  """The grading pool cannot grade: its workers did not start."""


class GradingTimeout(TimeoutError):
  """math-verify's own alarm fired: parsing or comparing took longer than it allows."""


def clip(text: str, limit: int = CLIP_CHARS) -> str:
  """`text` cut to `limit` characters for a log line, saying how long it was."""
  if len(text) <= limit:
    return text
  return f"{text[:limit]}... [{len(text):,} characters]"


# --------------------------------------------------------------------------- parsing


def _signal_timeout() -> int | None:
  """math-verify's alarm-based timeout, or None where signals cannot be used.

  `signal.signal` raises outside the main thread, so a loader thread or a test
  calling `parse_gold` there parses without a limit rather than failing.
  """
  if threading.current_thread() is threading.main_thread():
    return _worker_alarm_s or _SIGNAL_TIMEOUT_S
  return None


def _alarm_s(timeout_s: float) -> int:
  """math-verify's alarm in a worker: whole seconds, under the pool's `timeout_s` where
  it can be, so a slow SymPy call mostly gives up inside a worker that lives on,
  rather than the pool killing the worker and starting another."""
  return max(1, math.ceil(timeout_s) - 1)


def _init_worker(alarm_s: int) -> None:
  """Sets the worker's alarm and warms math-verify up (its parsers build on first use),
  so a new worker's first completion is not timed with that start-up."""
  global _worker_alarm_s
  _worker_alarm_s = alarm_s
  try:
    grade_one("\\boxed{\\frac{1}{2}}", "0.5")
  except BaseException:  # pylint: disable=broad-except  # a warm-up: the ping reports
    pass


def _parse_with(text: str, config: tuple, timeout: int | None) -> list:
  """math-verify's parse; [] if it fails; `GradingTimeout` if its alarm fires.

  `raise_on_error`, because otherwise math-verify reports its alarm only by logging
  the whole expression and returning [], which is indistinguishable from "unparseable".
  """
  try:
    return math_verify.parse(text, config, fallback_mode="no_fallback",
                             parsing_timeout=timeout, raise_on_error=True)
  except math_verify_errors.TimeoutException:  # a BaseException: not caught below
    raise GradingTimeout(f"math-verify's {timeout} s alarm while parsing "
                         f"{clip(text)}") from None
  except Exception:  # pylint: disable=broad-except  # unparseable text scores 0
    return []


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple:
  """math-verify's parse of one answer (no surrounding prose); () if unparseable.

  Cached: a worker sees the same gold for every rollout of a problem, and a group of
  rollouts often repeats the same final answer. A tuple, so callers cannot mutate the
  cached value. A parse cut off by the alarm raises `GradingTimeout` (not cached).
  """
  text = text.strip()
  if not text:
    return ()
  timeout = _signal_timeout()
  # Wrapped in `$...$` so the LaTeX reader treats the whole text as math; a gold that
  # already carries dollars ("$5$") becomes "$$5$$", which it also reads.
  parsed = _parse_with(f"${text}$", _LATEX, timeout)
  if not parsed:
    parsed = _parse_with(text, _EXPR, timeout)
  return tuple(parsed)


def parse_gold(text: str) -> list | None:
  """The gold answer as math-verify's parsed list, or None if it cannot be parsed.

  Dataset loaders call this to drop rows whose gold answer could never be matched,
  which includes one whose parse alone runs past math-verify's alarm.
  """
  try:
    parsed = _parse(text)
  except GradingTimeout:
    return None
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


def _equal(gold: Sequence, answer: Sequence, answer_text: str) -> bool:
  """math-verify's `verify(gold, answer)`: any pair of parses equal. A pair whose
  comparison hit the alarm counts as unequal; if no pair is equal, `GradingTimeout`
  says the 0 came from a timeout. (Never `str()` a parse here: on the expressions that
  time out, printing can hang too.)"""
  timeout, timed_out = _signal_timeout(), False
  for g, a in itertools.product(gold, answer):
    try:
      if math_verify.verify(g, a, timeout_seconds=timeout, raise_on_error=True):
        return True
    except math_verify_errors.TimeoutException:  # a BaseException: not caught below
      timed_out = True
    except Exception:  # pylint: disable=broad-except  # incomparable: not equal
      continue
  if timed_out:
    raise GradingTimeout(f"math-verify's {timeout} s alarm while comparing "
                         f"{clip(answer_text)} with the gold")
  return False


def grade_one(completion: str, gold: str, pattern: str = "") -> float:
  """1.0 iff the completion's final answer equals `gold` by math-verify, else 0.0.

  Pure and deterministic. Raises (ValueError) when `gold` cannot be parsed or
  `pattern` is malformed, and `GradingTimeout` when math-verify's own alarm cut the
  grading short: `MathVerifier` counts a raise as an error (a broken gold stays
  visible in the metrics instead of silently scoring every rollout 0) and a
  `GradingTimeout` as a timeout, both scored 0.
  """
  answer = extract_answer(completion, pattern)
  if answer is None:
    return 0.0
  gold_parsed = _parse(gold)
  if not gold_parsed:
    raise ValueError(f"gold answer {clip(repr(gold))}: math-verify cannot parse it; drop "
                     "the row (see parse_gold)")
  answer_parsed = _parse(answer)
  if not answer_parsed:
    return 0.0
  return 1.0 if _equal(gold_parsed, answer_parsed, answer) else 0.0


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


def main_module_cause() -> str:
  """What the main module has to do with workers that did not start, for the error.

  forkserver and spawn workers re-run the parent's main script (as `__mp_main__`) from
  its file before they serve. A script read from standard input has no file to re-run;
  a script that grades outside an `if __name__ == "__main__":` guard grades again in
  every worker. A guarded script, a module run with -m that is guarded, `python -c` or
  an interactive session is not the cause, and the hint would mislead.
  """
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  path = spec.origin if spec is not None else getattr(main, "__file__", None)
  elsewhere = "the workers' own errors are printed above (stderr)"
  if not path:
    return elsewhere  # nothing for the workers to re-run
  if not os.path.isabs(path):
    path = os.path.join(multiprocessing.process.ORIGINAL_DIR or os.getcwd(), path)
  if not os.path.isfile(path):
    source = ("standard input (`python -`)" if os.path.basename(path) == "<stdin>"
              else f"{path}, which is not a file")
    return (f"the main script was read from {source}; forkserver and spawn workers "
            "re-run the main script from its file, so it must be a file: save it to one "
            "and run that")
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
    self._started = False  # a pool of this verifier has answered its ping
    self._lock = threading.Lock()

  def _get_pool(self) -> pebble.ProcessPool:
    """The pool, started on first use and checked: its workers must answer a ping."""
    with self._lock:
      if self._pool is None:
        context = _start_context()
        pool = pebble.ProcessPool(max_workers=self.workers, context=context,
                                  initializer=_init_worker,
                                  initargs=(_alarm_s(self.timeout_s),))
        try:
          pool.schedule(_ready).result(timeout=STARTUP_TIMEOUT_S)
        except BaseException as e:  # pylint: disable=broad-except  # any failure: say why
          pool.stop()
          pool.join()
          reason = (f"no answer within {STARTUP_TIMEOUT_S:.0f} s" if isinstance(
              e, concurrent.futures.TimeoutError) else clip(repr(e)))
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
      high = len(tally.timeouts) >= WARN_TIMEOUT_FRACTION * count
      logging.log(
          logging.WARNING if high else logging.INFO,
          "math grading: %d of %d completions timed out (%g s each; scored 0), e.g. "
          "answer `%s` against gold `%s`%s", len(tally.timeouts), count, self.timeout_s,
          clip(extract_answer(completions[i], self.pattern) or completions[i]),
          clip(problems[i].answer),
          "; when most time out, the gold answers may be expressions SymPy cannot "
          "evaluate in time: check them, or raise task.verifier_timeout_s" if high else "")
    if tally.errors:
      i, error = tally.errors[0]
      logging.warning("math grading: %d of %d completions raised (scored 0)%s, e.g. %s on "
                      "gold `%s`", len(tally.errors), count,
                      "; the pool broke and is replaced" if tally.broken else "",
                      clip(error), clip(problems[i].answer))
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
