"""Multi-digit addition: a verifiable task family with a difficulty knob.

A problem is `"<a>+<b>="` with both operands of `digits` digits; the answer is the
decimal sum followed by EOS. More digits means more carries to get right, so a small
transformer trained briefly on it has per-problem pass rates spread from about 0 to
about 1: exactly what an RL demo needs, with nothing to download.

The verifier (`reward`) scores a completion 1.0 when it is exactly the sum (surrounding
whitespace ignored) and 0.0 otherwise, malformed text included; it never raises.
"""

from __future__ import annotations

import hashlib

import numpy as np

from isojax.tasks import problem as problem_lib
from isojax.tasks.settings import TaskSettings

ALPHABET = "0123456789+="


# A problem's prompt is "123+45=", its answer "168", its difficulty the operand digits.
Problem = problem_lib.Problem
DEFAULT_INSTRUCTION = ""  # the base model completes "12+34=" directly


def _operand(rng: np.random.Generator, digits: int) -> int:
  low = 0 if digits == 1 else 10 ** (digits - 1)
  return int(rng.integers(low, 10 ** digits))


def sample_problem(rng: np.random.Generator, min_digits: int, max_digits: int) -> Problem:
  digits = int(rng.integers(min_digits, max_digits + 1))
  a, b = _operand(rng, digits), _operand(rng, digits)
  return Problem(prompt=f"{a}+{b}=", answer=str(a + b), difficulty=digits)


def is_validation(prompt: str) -> bool:
  """A fixed 1-in-8 hash partition, so train and validation never share a problem."""
  return hashlib.sha256(prompt.encode()).digest()[0] % 8 == 0


def draw_problems(seed: int, num_train: int, num_val: int, min_digits: int,
                  max_digits: int) -> tuple[list[Problem], list[Problem]]:
  """`num_train` training and `num_val` validation problems (the `is_validation`
  partition), distinct and deterministic in `seed`: the task's problems
  (`make_splits`) and difficulty profiling's candidate pools.

  The draws are capped: the validation partition holds about 1/8 of the space, so a
  digit range with too few distinct problems is a ValueError rather than an endless loop.
  """
  rng = np.random.default_rng(seed)
  seen, train, val = set(), [], []
  max_draws, draws = 64 * (num_train + num_val) + 100_000, 0
  while (len(train) < num_train or len(val) < num_val) and draws < max_draws:
    draws += 1
    p = sample_problem(rng, min_digits, max_digits)
    if p.prompt in seen:
      continue
    seen.add(p.prompt)
    split = val if is_validation(p.prompt) else train
    if len(split) < (num_val if split is val else num_train):
      split.append(p)
  if len(train) == num_train and len(val) == num_val:
    return train, val
  raise ValueError(
      f"could draw only {len(train)} of {num_train} training and {len(val)} of {num_val} "
      f"validation problems with digits in [{min_digits}, {max_digits}] in {max_draws} "
      "draws: too few distinct problems")


def make_splits(seed: int, num_train: int, num_val: int, min_digits: int,
                max_digits: int) -> tuple[list[Problem], list[Problem]]:
  """Disjoint train and validation problem lists, deterministic in `seed`."""
  space = sum(_count(d) for d in range(min_digits, max_digits + 1))
  if num_train + num_val > space // 2:
    raise ValueError(f"task.num_train + task.num_val = {num_train + num_val} is too many "
                     f"distinct problems for digits in [{min_digits}, {max_digits}]")
  try:
    return draw_problems(seed, num_train, num_val, min_digits, max_digits)
  except ValueError as e:
    raise ValueError(f"task.num_train={num_train}, task.num_val={num_val}: {e}; lower "
                     "them or widen the digit range") from e


def _count(digits: int) -> int:
  """Distinct `a+b=` problems with two operands of `digits` digits."""
  operands = 10 if digits == 1 else 9 * 10 ** (digits - 1)
  return operands * operands


def reward(completion: str, problem: Problem) -> float:
  """1.0 iff `completion` is exactly the answer's digits; 0.0 for anything else."""
  try:
    text = completion.strip()
    return float(text.isascii() and text.isdigit() and text == problem.answer)
  except Exception:  # pylint: disable=broad-except  # a verifier must never crash a run
    return 0.0


def sft_text(problem: Problem) -> tuple[str, str]:
  """(prompt, target) for supervised pre-training of the tiny base model."""
  return problem.prompt, problem.answer


def validate(task: TaskSettings) -> None:
  for field in ("min_digits", "max_digits", "num_train", "num_val"):
    value = getattr(task, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"task.{field}={value!r}: expected a positive integer")
  if task.min_digits > task.max_digits:
    raise ValueError(f"task.min_digits={task.min_digits} > task.max_digits={task.max_digits}")


def load(task: TaskSettings) -> problem_lib.TaskData:
  return problem_lib.TaskData(*make_splits(task.seed, task.num_train, task.num_val,
                                           task.min_digits, task.max_digits))


def make_verifier(task: TaskSettings) -> problem_lib.Verifier:
  del task  # exact match needs no settings
  return problem_lib.PerItemVerifier(reward)
