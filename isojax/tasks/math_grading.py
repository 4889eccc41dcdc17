"""One math completion graded against its gold answer by `math-verify`: the final answer
extracted (the last `\\boxed{...}`, or a caller's regex), both sides parsed, compared.

Pure and deterministic, so it runs anywhere; `math_verifier.MathVerifier` runs it in
worker processes with a hard timeout, because SymPy can run for minutes (or crash) on a
pathological expression. math-verify's own limit is a `signal.alarm`: whole seconds,
in a main thread only; elsewhere (a loader thread) parsing runs without one.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
from typing import Sequence

import math_verify
from math_verify import errors as math_verify_errors


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


_worker_alarm_s: int | None = None  # set in each worker (`set_alarm_s`)


# Log lines show at most this many characters of a completion, answer or expression.
CLIP_CHARS = 200


class GradingTimeout(TimeoutError):
  """math-verify's own alarm fired: parsing or comparing took longer than it allows."""


def clip(text: str, limit: int = CLIP_CHARS) -> str:
  """`text` cut to `limit` characters for a log line, saying how long it was."""
  if len(text) <= limit:
    return text
  return f"{text[:limit]}... [{len(text):,} characters]"


def set_alarm_s(seconds: int) -> None:
  """math-verify's alarm in this process (a grading worker's, below its pool timeout)."""
  global _worker_alarm_s
  _worker_alarm_s = seconds


def _signal_timeout() -> int | None:
  """math-verify's alarm-based timeout, or None where signals cannot be used.

  `signal.signal` raises outside the main thread, so a loader thread or a test
  calling `parse_gold` there parses without a limit rather than failing.
  """
  if threading.current_thread() is threading.main_thread():
    return _worker_alarm_s or _SIGNAL_TIMEOUT_S
  return None


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


def check_pattern(pattern: str) -> None:
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
    check_pattern(pattern)
    matches = list(re.finditer(pattern, completion, re.DOTALL))
    answer = matches[-1].group(1) if matches else None
  else:
    answer = _last_box(completion)
  if answer is None or not answer.strip():
    return None
  return answer.strip()


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
