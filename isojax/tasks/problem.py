"""What every task family hands the RL loop: problems and a batch verifier.

A `Problem` is text only (the question as a user would ask it, before any chat
template, and its gold answer), so problem lists are plain data that splits, sweeps
and profiling can write to JSON. Families that need more to grade a completion
(reasoning-gym's entry metadata) keep it as a JSON string in `meta`.

A `Verifier` grades a batch of completions at once and returns `Grades`: rewards in
[0, 1] plus counts of completions whose grading timed out or failed (those score 0).
`grade_async` returns a future so grading can overlap device work; families whose
grading is cheap and local complete it immediately.
"""

from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Problem:
  prompt: str          # the question, before any chat template or instruction
  answer: str          # the gold answer the verifier compares against
  difficulty: int = 0  # family-specific knob (arithmetic: operand digits); 0 if none
  meta: str = ""       # family-specific JSON (reasoning-gym: the dataset entry)


@dataclasses.dataclass
class TaskData:
  """What every family's `load(task)` returns: its problems and the rows it skipped."""
  train: list[Problem]
  val: list[Problem]
  # "<train|val>/<reason>" -> rows dropped at load time (logged, never silent)
  skipped: dict[str, int] = dataclasses.field(default_factory=dict)
  # "<train|val>/<reason>" -> the first few of them, as "<file> row <i>"
  skipped_rows: dict[str, list[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Grades:
  rewards: np.ndarray  # [B] float32 in [0, 1]
  timeouts: int = 0    # completions cut off by the per-completion timeout (scored 0)
  errors: int = 0      # completions whose grading raised (scored 0)


class Verifier(abc.ABC):
  """Grades completions against problems; subclasses implement `grade`."""

  @abc.abstractmethod
  def grade(self, completions: Sequence[str], problems: Sequence[Problem]) -> Grades:
    """Rewards [B] for completion b of problem b, with timeout and error counts."""

  def grade_async(self, completions: Sequence[str], problems: Sequence[Problem]
                  ) -> concurrent.futures.Future:
    """A future of `grade(...)`; here computed at once, pools override it."""
    future = concurrent.futures.Future()
    try:
      future.set_result(self.grade(completions, problems))
    except BaseException as e:  # pylint: disable=broad-except  # surfaced by .result()
      future.set_exception(e)
    return future

  def close(self) -> None:
    """Releases worker processes, if any."""


class PerItemVerifier(Verifier):
  """A verifier from a cheap `reward(completion, problem) -> float` that never raises."""

  def __init__(self, reward_fn):
    self.reward_fn = reward_fn

  def grade(self, completions: Sequence[str], problems: Sequence[Problem]) -> Grades:
    if len(completions) != len(problems):
      raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    return Grades(np.array([self.reward_fn(c, p) for c, p in zip(completions, problems)],
                           np.float32))
