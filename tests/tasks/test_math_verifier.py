"""Math grading: what math-verify counts as equal, answer extraction, and a pool that
survives completions whose grading hangs, raises or kills its worker."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import time
import types

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from isojax.tasks import math_grading, math_verifier
from isojax.tasks.problem import Problem

TIMEOUT_S = 1.0
HANG, RAISE, CRASH = "<<HANG>>", "<<RAISE>>", "<<CRASH>>"


def _misbehaving_grade(completion: str, gold: str, pattern: str = "") -> float:
  """grade_one, except on marker completions: hang forever, raise, or kill the worker.

  Module level so the pool can pickle it to its workers.
  """
  if HANG in completion:
    time.sleep(3600)
  if RAISE in completion:
    raise RuntimeError("injected failure")
  if CRASH in completion:
    os._exit(3)  # like a segfault in a native library: the worker dies
  return math_grading.grade_one(completion, gold, pattern)


def _box(answer: str) -> str:
  return f"Let me work it out. ... So the answer is \\boxed{{{answer}}}."


# (completion, gold, expected reward): what math-verify 0.9 really does.
GRADE_TABLE = [
  # Fractions and decimals in any form.
  (_box("\\frac{1}{2}"), "0.5", 1.0),
  (_box("0.5"), "\\frac{1}{2}", 1.0),
  (_box("1/2"), "\\frac{1}{2}", 1.0),
  (_box("\\dfrac{1}{2}"), "1/2", 1.0),
  (_box("0.50"), "1/2", 1.0),
  (_box("0.3333333"), "\\frac{1}{3}", 1.0),
  (_box("0.333"), "\\frac{1}{3}", 0.0),  # compared after rounding to 6 decimals
  (_box("72.0"), "72", 1.0),
  # LaTeX expressions, compared symbolically.
  (_box("\\sqrt{2}"), "\\sqrt{2}", 1.0),
  (_box("2^{1/2}"), "\\sqrt{2}", 1.0),
  (_box("\\frac{\\sqrt{2}}{2}"), "\\frac{1}{\\sqrt{2}}", 1.0),
  (_box("2\\sqrt{3}"), "\\sqrt{12}", 1.0),
  (_box("x^2+2x+1"), "(x+1)^2", 1.0),
  (_box("\\pi"), "\\pi", 1.0),
  (_box("3.14"), "\\pi", 0.0),
  (_box("\\infty"), "\\infty", 1.0),
  # Intervals and sets.
  (_box("(1, 2]"), "(1,2]", 1.0),
  (_box("[1, 2]"), "(1,2]", 0.0),
  (_box("\\left( 1, 2 \\right)"), "(1,2)", 1.0),
  (_box("\\{1,2,3\\}"), "\\{3,2,1\\}", 1.0),
  (_box("1,2,3"), "\\{1,2,3\\}", 1.0),
  # Signs.
  (_box("-3"), "-3", 1.0),
  (_box("3"), "-3", 0.0),
  # Thousands separators: commas are read, thin spaces and plain spaces are not.
  (_box("1,000"), "1000", 1.0),
  (_box("1000"), "1,000", 1.0),
  (_box("1\\,000"), "1000", 0.0),
  (_box("1 000"), "1000", 0.0),
  (_box("1.5e3"), "1500", 0.0),  # scientific e-notation is not read
  # Units, dollars and percent: LaTeX-marked ones are stripped, a bare word is not.
  (_box("5 \\text{ cm}"), "5", 1.0),
  (_box("5\\text{cm}"), "5", 1.0),
  (_box("5 cm"), "5", 1.0),
  (_box("\\$18"), "18", 1.0),
  (_box("18"), "\\$18", 1.0),
  (_box("\\$18.00"), "18", 1.0),
  (_box("18 dollars"), "18", 0.0),  # "dollars" becomes a product of symbols
  (_box("10\\%"), "10", 1.0),
  (_box("10\\%"), "0.1", 1.0),  # math-verify accepts a percent read either way
  (_box("$5$"), "5", 1.0),
  (_box("x = 5"), "5", 1.0),  # the right-hand side of a bare equation
  # GSM8K-style integer golds.
  (_box("72"), "72", 1.0),
  (_box("71"), "72", 0.0),
  ("Natalia sold 48 + 24 = 72 clips. #### 72", "72", 0.0),  # no box, no answer
  ("The answer is 72", "72", 0.0),
  # Multiple-choice letters.
  (_box("\\text{(A)}"), "A", 1.0),
  (_box("B"), "A", 0.0),
  # Boxes: nested braces, the last box counts, \fbox and `\boxed {`.
  ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),
  ("First \\boxed{3}, then on reflection \\boxed{4}.", "4", 1.0),
  ("First \\boxed{4}, then on reflection \\boxed{3}.", "4", 0.0),
  ("\\fbox{7}", "7", 1.0),
  ("\\boxed {7}", "7", 1.0),
  ("\\boxed{7", "7", 0.0),  # cut off before the box closed
  # Garbage and empty text.
  ("", "72", 0.0),
  ("\\boxed{}", "72", 0.0),
  ("\\boxed{}}{{\\frac{", "72", 0.0),
  (_box("\\frac{"), "72", 0.0),
  (_box("banana"), "72", 0.0),
]


@pytest.mark.parametrize("completion,gold,expected", GRADE_TABLE)
def test_grade_one_table(completion, gold, expected):
  assert math_grading.grade_one(completion, gold) == expected


@pytest.mark.parametrize("completion,expected", [
  ("<think>so 1/2</think><answer>0.5</answer>", 1.0),
  ("<answer>7</answer> then <answer> \\frac{1}{2} </answer>", 1.0),  # last one counts
  ("<answer>\n1/2\n</answer>", 1.0),  # DOTALL: the answer may span lines
  ("<answer>0.4</answer>", 0.0),
  ("\\boxed{1/2}", 0.0),  # a box is not the custom pattern's answer
])
def test_grade_one_custom_pattern(completion, expected):
  assert math_grading.grade_one(completion, "\\frac{1}{2}", "<answer>(.*?)</answer>") == expected


@pytest.mark.parametrize("completion,pattern,expected", [
  ("\\boxed{5}", "", "5"),
  ("\\boxed{\\frac{a}{b}}", "", "\\frac{a}{b}"),
  ("\\boxed{1} and \\boxed{ 2 }", "", "2"),
  ("\\boxed{\\boxed{3}}", "", "\\boxed{3}"),  # the outermost box
  ("\\boxed{\\{1, 2\\}}", "", "\\{1, 2\\}"),  # escaped braces do not close the box
  ("\\boxed{5} then \\boxed{6", "", "5"),  # a truncated last box is skipped
  ("\\fbox{x}", "", "x"),
  ("\\boxed  {x}", "", "x"),
  ("no box here", "", None),
  ("\\boxed{  }", "", None),
  ("Answer: 12\nAnswer: 13 ", r"Answer:([^\n]*)", "13"),
  ("<answer>a</answer><answer>b</answer>", "<answer>(.*?)</answer>", "b"),
  ("nothing", "<answer>(.*?)</answer>", None),
])
def test_extract_answer(completion, pattern, expected):
  assert math_grading.extract_answer(completion, pattern) == expected


@pytest.mark.parametrize("pattern", ["<answer>.*</answer>", "(a)(b)"])
def test_extract_answer_rejects_pattern_without_one_group(pattern):
  with pytest.raises(ValueError, match="one capture group"):
    math_grading.extract_answer("<answer>1</answer>", pattern)


def test_parse_gold():
  assert [str(x) for x in math_grading.parse_gold("\\frac{1}{2}")] == ["1/2"]
  assert [str(x) for x in math_grading.parse_gold("1,000")] == ["1000"]
  for text in ["", "   ", "\\frac{", "}}{{", "???"]:
    assert math_grading.parse_gold(text) is None, text


def test_grade_one_raises_on_unparseable_gold():
  with pytest.raises(ValueError, match="gold answer"):
    math_grading.grade_one("\\boxed{1}", "\\frac{")


def test_verifier_validates_arguments():
  with pytest.raises(ValueError, match="pattern="):
    math_verifier.MathVerifier(pattern="no group")
  with pytest.raises(ValueError, match="timeout_s="):
    math_verifier.MathVerifier(timeout_s=0)
  with pytest.raises(ValueError, match="workers="):
    math_verifier.MathVerifier(workers=-1)
  assert math_verifier.MathVerifier().workers == min(4, os.cpu_count())


# ------------------------------------------------------------------------- the pool


@pytest.fixture(scope="module")
def verifier():
  """One warmed pool for the module: worker start-up is kept out of the timings."""
  with math_verifier.MathVerifier(timeout_s=TIMEOUT_S, workers=2,
                                  grade_fn=_misbehaving_grade) as v:
    v.grade([_box("1")] * 2, [Problem("p", "1")] * 2)
    yield v


def _batch(markers: dict[int, str], size: int = 5):
  """Completions answering problem i with i (correct) or i + 1 (wrong, odd i)."""
  completions, problems, expected = [], [], []
  for i in range(size):
    answer = i if i % 2 == 0 else i + 1
    completions.append(markers.get(i, "") + _box(str(answer)))
    problems.append(Problem(f"problem {i}", str(i)))
    expected.append(0.0 if i in markers else float(answer == i))
  return completions, problems, np.array(expected, np.float32)


def test_grade_scores_batch(verifier):
  completions, problems, expected = _batch({})
  grades = verifier.grade(completions, problems)
  np.testing.assert_array_equal(grades.rewards, expected)
  assert grades.rewards.dtype == np.float32
  assert (grades.timeouts, grades.errors) == (0, 0)


def test_hung_completion_times_out_and_pool_survives(verifier):
  completions, problems, expected = _batch({2: HANG})
  start = time.monotonic()
  grades = verifier.grade(completions, problems)
  elapsed = time.monotonic() - start
  # It ends with the timeout, not with the hang (which never ends); generous slack for
  # restarting the killed worker on a loaded machine.
  assert elapsed < TIMEOUT_S + 30.0, elapsed
  np.testing.assert_array_equal(grades.rewards, expected)
  assert (grades.timeouts, grades.errors) == (1, 0)
  # The killed worker was replaced: a second batch is graded in full.
  completions, problems, expected = _batch({})
  grades = verifier.grade(completions, problems)
  np.testing.assert_array_equal(grades.rewards, expected)
  assert (grades.timeouts, grades.errors) == (0, 0)


def test_raising_and_crashing_completions_count_as_errors(verifier):
  completions, problems, expected = _batch({1: RAISE, 4: CRASH})
  completions.append(_box("1"))  # a gold math-verify cannot parse: grade_one raises
  problems.append(Problem("broken", "\\frac{"))
  expected = np.append(expected, np.float32(0.0))
  grades = verifier.grade(completions, problems)
  np.testing.assert_array_equal(grades.rewards, expected)
  assert (grades.timeouts, grades.errors) == (0, 3)


def test_grade_async_overlaps_and_matches_grade(verifier):
  completions, problems, expected = _batch({0: HANG})
  future = verifier.grade_async(completions, problems)
  assert not future.done()  # queued, not graded, before returning
  grades = future.result(timeout=TIMEOUT_S + 10.0)
  np.testing.assert_array_equal(grades.rewards, expected)
  assert (grades.timeouts, grades.errors) == (1, 0)
  # Without the hang, the async and blocking paths agree on the same batch.
  completions, problems, _ = _batch({})
  async_grades = verifier.grade_async(completions, problems).result()
  grades = verifier.grade(completions, problems)
  np.testing.assert_array_equal(async_grades.rewards, grades.rewards)
  assert (async_grades.timeouts, async_grades.errors) == (grades.timeouts, grades.errors)


def test_grade_edge_batches(verifier):
  grades = verifier.grade([], [])
  assert grades.rewards.shape == (0,) and grades.rewards.dtype == np.float32
  with pytest.raises(ValueError, match="2 completions for 1 problems"):
    verifier.grade(["a", "b"], [Problem("p", "1")])


_texts = st.one_of(st.text(max_size=40), st.text(max_size=40).map(lambda s: f"\\boxed{{{s}}}"))


@hypothesis.settings(max_examples=5, deadline=None)  # each example is a pool round trip
@hypothesis.given(completions=st.lists(_texts, min_size=1, max_size=6),
                  gold=st.one_of(st.text(max_size=10), st.sampled_from(["72", "\\frac{1}{2}"])))
def test_grade_never_raises_on_arbitrary_text(verifier, completions, gold):
  grades = verifier.grade(completions, [Problem("p", gold)] * len(completions))
  assert grades.rewards.shape == (len(completions),)
  assert set(grades.rewards.tolist()) <= {0.0, 1.0}
  assert grades.timeouts + grades.errors <= len(completions)


def test_pool_starts_lazily_and_close_releases_it():
  v = math_verifier.MathVerifier(workers=1)
  assert v._pool is None  # pylint: disable=protected-access  # nothing started yet
  with v:
    assert v.grade([_box("0.5")], [Problem("p", "1/2")]).rewards.tolist() == [1.0]
    assert v._pool is not None  # pylint: disable=protected-access
  assert v._pool is None  # pylint: disable=protected-access


_UNGUARDED = """
from isojax.tasks import math_verifier
from isojax.tasks.problem import Problem
math_verifier.STARTUP_TIMEOUT_S = 5.0  # a hang ends sooner; the error names the same cause
v = math_verifier.MathVerifier(timeout_s=2, workers=2)
g = v.grade(["\\\\boxed{{2}}"] * {n}, [Problem("1 + 1", "2")] * {n})
print("graded", g.rewards.mean(), flush=True)
"""


@pytest.mark.parametrize("n", [100, 400])  # zeros and a silent hang, before the checks
def test_an_unguarded_script_raises_naming_the_guard(tmp_path, n):
  script = tmp_path / "grade.py"  # no `if __name__ == "__main__":`
  script.write_text(_UNGUARDED.format(n=n))
  # A hang (what the pool did before it checked) fails here, as a TimeoutExpired.
  proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode != 0 and "graded" not in proc.stdout
  assert "VerifierPoolError: the math grading pool" in proc.stderr, proc.stderr[-2000:]
  error = _pool_error(proc.stderr)
  assert f"the main script {script} has no `__main__` guard" in error
  assert 'if __name__ == "__main__":' in error


class _SilentPool:
  """A pool whose tasks never run (a stalled pool): futures that never complete."""

  def __init__(self, *args, **kwargs):
    del args, kwargs
    self.stopped = False

  def schedule(self, *args, **kwargs):
    del args, kwargs
    return concurrent.futures.Future()

  def stop(self):
    self.stopped = True

  def join(self):
    pass


def test_a_pool_that_never_answers_fails_to_start(monkeypatch):
  monkeypatch.setattr(math_verifier, "STARTUP_TIMEOUT_S", 0.5)
  monkeypatch.setattr(math_verifier.pebble, "ProcessPool", _SilentPool)
  start = time.monotonic()
  with pytest.raises(math_verifier.VerifierPoolError, match="did not start: no answer "
                     "within 0 s"):
    math_verifier.MathVerifier(workers=2).grade([_box("1")], [Problem("p", "1")])
  assert time.monotonic() - start < 30  # the allowance ended it, not a hang


def test_a_stalled_batch_scores_its_pending_completions_as_timeouts(monkeypatch):
  """4 completions, 2 workers, 1 s each: the batch may take 2 x 1 s plus the start-up
  allowance (0.5 s here); then it returns zeros with every pending completion a
  timeout and the stuck pool is stopped. A replacement that does not start scores its
  batch 0 as errors (the verifier worked before: no raise); the next one grades."""
  monkeypatch.setattr(math_verifier, "STARTUP_TIMEOUT_S", 0.5)
  v = math_verifier.MathVerifier(timeout_s=1.0, workers=2)
  pool = v._pool = _SilentPool()  # pylint: disable=protected-access  # already started
  v._started = True  # pylint: disable=protected-access
  start = time.monotonic()
  grades = v.grade_async([_box("1")] * 4, [Problem("p", "1")] * 4).result(timeout=10)
  assert 2.35 < time.monotonic() - start < 30  # not before the deadline; no hang
  np.testing.assert_array_equal(grades.rewards, np.zeros(4, np.float32))
  assert (grades.timeouts, grades.errors) == (4, 0)
  deadline = time.monotonic() + 5
  while not pool.stopped and time.monotonic() < deadline:
    time.sleep(0.01)
  assert pool.stopped and v._pool is None  # pylint: disable=protected-access
  real_pool = math_verifier.pebble.ProcessPool
  monkeypatch.setattr(math_verifier.pebble, "ProcessPool", _SilentPool)
  grades = v.grade([_box("1")] * 4, [Problem("p", "1")] * 4)
  np.testing.assert_array_equal(grades.rewards, np.zeros(4, np.float32))
  assert (grades.timeouts, grades.errors) == (0, 4)
  monkeypatch.setattr(math_verifier.pebble, "ProcessPool", real_pool)
  monkeypatch.setattr(math_verifier, "STARTUP_TIMEOUT_S", 30.0)
  with v:
    completions, problems, expected = _batch({})
    grades = v.grade(completions, problems)
  np.testing.assert_array_equal(grades.rewards, expected)
  assert (grades.timeouts, grades.errors) == (0, 0)


def test_a_batch_that_all_times_out_scores_zeros_and_grading_goes_on(monkeypatch, caplog):
  """Every answer compared with `9^{9^{9^{9}}}` runs past the 0.5 s timeout (SymPy
  evaluates the power). With a start-up allowance of 0.2 s the batch also passes its
  deadline (3 rounds x 0.5 s + 0.2 s, less than the kills and restarts take), as a
  large batch does at the default settings. Nothing raises: six timeouts, a warning,
  and the same verifier grades the next batch right."""
  with math_verifier.MathVerifier(timeout_s=0.5, workers=2) as v:
    v.grade([_box("1")], [Problem("p", "1")])  # started at the default allowance
    monkeypatch.setattr(math_verifier, "STARTUP_TIMEOUT_S", 0.2)
    start = time.monotonic()
    with caplog.at_level("WARNING"):
      grades = v.grade([_box(str(i)) for i in range(6)],
                       [Problem("tower", "9^{9^{9^{9}}}")] * 6)
    assert time.monotonic() - start < 60  # the deadline ended it, not SymPy
    np.testing.assert_array_equal(grades.rewards, np.zeros(6, np.float32))
    assert (grades.timeouts, grades.errors) == (6, 0)
    assert "6 of 6 completions timed out" in caplog.text
    assert "against gold `9^{9^{9^{9}}}`" in caplog.text
    monkeypatch.setattr(math_verifier, "STARTUP_TIMEOUT_S", 30.0)
    completions, problems, expected = _batch({})
    grades = v.grade(completions, problems)
  np.testing.assert_array_equal(grades.rewards, expected)
  assert (grades.timeouts, grades.errors) == (0, 0)


_DEEP = "\\frac{1}{" * 20_000 + "2" + "}" * 20_000  # 200 KB; parsing it takes minutes


def test_math_verify_alarm_is_a_timeout_and_logs_stay_short(monkeypatch, caplog):
  """math-verify's own alarm (its TimeoutException, a BaseException) raises
  `GradingTimeout`, a TimeoutError, not a silent 0; in the pool it counts as a timeout,
  and the worker lives on (the alarm, not the pool's kill, ended it). No log line holds
  more than a clipped prefix of the 200 KB answer or of a 2 KB gold."""
  monkeypatch.setattr(math_grading, "_SIGNAL_TIMEOUT_S", 1)
  caplog.set_level("DEBUG")
  start = time.monotonic()
  with pytest.raises(math_grading.GradingTimeout) as timed_out:
    math_grading.grade_one(_box(_DEEP), "1")
  # The 1 s alarm ended it, not the minutes the parse takes.
  assert isinstance(timed_out.value, TimeoutError) and time.monotonic() - start < 30
  assert len(str(timed_out.value)) < 500
  assert math_grading.parse_gold(_DEEP) is None  # a loader drops such a gold row
  broken_gold = "\\frac{" + "x" * 2_000
  # The workers' alarm at 1 s, well before the pool's 5 s (for a loaded machine; by
  # default it is 4 s), so the alarm ends the deep one.
  monkeypatch.setattr(math_verifier, "_alarm_s", lambda timeout_s: 1)
  with math_verifier.MathVerifier(timeout_s=5.0, workers=1) as v:
    # pylint: disable=protected-access
    worker = v._get_pool().schedule(math_verifier._ready).result()
    grades = v.grade([_box(_DEEP), _box("1"), _box("1")],
                     [Problem("deep", "1"), Problem("p", "1"),
                      Problem("broken", broken_gold)])
    assert v._get_pool().schedule(math_verifier._ready).result() == worker
    # pylint: enable=protected-access
  np.testing.assert_array_equal(grades.rewards, [0, 1, 0])
  assert (grades.timeouts, grades.errors) == (1, 1)
  assert "1 of 3 completions timed out" in caplog.text
  assert _DEEP[:math_grading.CLIP_CHARS] in caplog.text and _DEEP not in caplog.text
  assert broken_gold[:100] in caplog.text and broken_gold not in caplog.text
  assert max(len(r.getMessage()) for r in caplog.records) < 2000


_GUARDED = """
from isojax.tasks import math_verifier
from isojax.tasks.problem import Problem

if __name__ == "__main__":
  v = math_verifier.MathVerifier(timeout_s=2, workers=1)
  print("graded", v.grade(["\\\\boxed{2}"], [Problem("1 + 1", "2")]).rewards, flush=True)
"""


def _pool_error(stderr: str) -> str:
  """The parent's error line: printed last (workers re-running a script print theirs)."""
  return [l for l in stderr.splitlines()
          if l.startswith("isojax.tasks.math_verifier.VerifierPoolError")][-1]


@pytest.mark.slow("a script on standard input, then from a file, in subprocesses")
def test_a_guarded_script_on_standard_input_is_told_to_be_a_file(tmp_path):
  """`python - <<EOF`: the workers cannot re-run a main script that has no file. The
  error says so, and not that the (present) `__main__` guard is missing. (That it comes
  before any worker starts is the in-process test below's.)"""
  proc = subprocess.run([sys.executable, "-"], input=_GUARDED, cwd=tmp_path,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode != 0 and "graded" not in proc.stdout
  error = _pool_error(proc.stderr)
  assert "read from standard input (`python -`)" in error and "must be a file" in error
  assert "__main__" not in error
  script = tmp_path / "grade.py"  # the same script as a file grades
  script.write_text(_GUARDED)
  proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120)
  assert proc.returncode == 0 and "graded [1.]" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.parametrize("path", ["<stdin>", "gone.py"])
def test_a_main_script_that_is_not_a_file_is_refused_before_any_worker_starts(
    path, tmp_path, monkeypatch):
  """Workers re-run the main script from its file, so without one none could start:
  the verifier says why at once and has started no pool."""
  main = types.ModuleType("__main__")
  main.__file__ = str(tmp_path / path)
  monkeypatch.setitem(sys.modules, "__main__", main)
  v = math_verifier.MathVerifier(timeout_s=2, workers=1)
  with pytest.raises(math_verifier.VerifierPoolError, match="cannot start") as e:
    v.grade(["\\boxed{2}"], [Problem("1 + 1", "2")])
  assert "must be a file" in str(e.value)
  assert ("standard input" in str(e.value)) == (path == "<stdin>")
  assert v._pool is None  # pylint: disable=protected-access


def test_the_main_module_cause_names_only_a_real_cause(tmp_path, monkeypatch):
  guarded, unguarded = tmp_path / "guarded.py", tmp_path / "unguarded.py"
  guarded.write_text(_GUARDED)
  unguarded.write_text(_UNGUARDED)
  for path, expected in [(str(guarded), "is guarded, so not the cause"),
                         (str(unguarded), 'has no `__main__` guard: workers started'),
                         ("<stdin>", "must be a file"),
                         (None, "the workers' own errors are printed above")]:
    main = types.ModuleType("__main__")
    if path:
      main.__file__ = path
    monkeypatch.setitem(sys.modules, "__main__", main)
    cause = math_verifier.main_module_cause()
    assert expected in cause, (path, cause)
    assert ('if __name__ == "__main__":' in cause) == (path == str(unguarded)), cause


@pytest.mark.slow("a 2-step training run whose every grading times out (worker restarts)")
def test_a_run_whose_gold_answers_all_time_out_finishes_with_them_counted(tmp_path):
  """The shipped arithmetic base model answers "12+34=" with digits; the math task's
  gold for every problem is `9^{9^{9^{9}}}`, so every answer's grading runs into the
  timeout. The run finishes its steps and metrics.jsonl counts the timeouts."""
  import importlib  # pylint: disable=g-import-not-at-top
  import json  # pylint: disable=g-import-not-at-top
  from isojax import run_dir  # pylint: disable=g-import-not-at-top
  from isojax.base_models import demo_bases  # pylint: disable=g-import-not-at-top
  from isojax.run import train  # pylint: disable=g-import-not-at-top
  data = tmp_path / "tower.jsonl"
  data.write_text("".join(json.dumps({"q": f"{a}+{b}=", "a": "9^{9^{9^{9}}}"}) + "\n"
                          for a in range(10, 20) for b in (21, 43)))
  config = importlib.import_module("isojax.configs.easy").get_config("micro")
  config.base_model.path = demo_bases.shipped_dir("arithmetic")
  config.task.update(name="math", format="generic", question_field="q", answer_field="a",
                     train_files=str(data), num_train=0, num_val=2, instruction="",
                     prompt_format="plain", answer_pattern=r"(\d+)", verifier_workers=2,
                     verifier_timeout_s=0.5, splits_dir=str(tmp_path / "splits"))
  config.update(num_steps=2, rollouts_per_problem=2, problems_per_batch=2,
                checkpoint_every=2, log_every=1)
  config.eval.update(every=2, num_samples=1, k=1, train_problems=0)
  train.run(config, str(tmp_path / "run"))
  lines = [l for l in run_dir.read_metrics(str(tmp_path / "run")) if "event" not in l]
  steps = {l["step"]: l for l in lines if "train/verifier_timeouts" in l}
  assert sorted(steps) == [1, 2], lines
  for line in steps.values():
    assert line["train/verifier_timeouts"] >= 1 and line["train/verifier_errors"] == 0
    assert line["train/reward"] == 0
