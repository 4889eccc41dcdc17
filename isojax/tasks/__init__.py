"""The task registry: `task.name` picks a family of problems and its verifier.

  arithmetic     multi-digit additions generated from a difficulty knob (the embedded
                 default; exact-match verifier)
  reasoning_gym  any `reasoning-gym` dataset by name, generated locally from a seed,
                 graded by the dataset's own `score_answer`
  math           problems from local files (JSONL / JSON / Parquet / CSV / Arrow, a
                 `save_to_disk` directory, or a prepared TFDS dataset), graded with
                 `math-verify` in worker processes
  recall         one key token -> one answer token, nothing shared between problems,
                 base pass rates 2^-level by construction (the study's testbed for
                 coverage and sharpening; exact-match verifier)

Every family module provides the same four things, and the registry treats them alike:
`validate(task)` (cheap field checks, run before anything is compiled or written),
`load(task) -> TaskData` (its problems and the rows it skipped), `make_verifier(task)`
and `DEFAULT_INSTRUCTION` (appended to each question when `task.instruction` is unset).
Families are imported lazily, so the config layer can list the names without loading
`datasets` or `reasoning-gym`.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import numpy as np

from isojax.tasks import splits
from isojax.tasks.settings import PROMPT_FORMATS, TaskSettings
from isojax.tasks.problem import Grades, PerItemVerifier, Problem, TaskData, Verifier

NAMES = ("arithmetic", "reasoning_gym", "math", "recall")
_MODULES = {"arithmetic": "isojax.tasks.arithmetic",
            "reasoning_gym": "isojax.tasks.reasoning_gym_task",
            "math": "isojax.tasks.math_data",
            "recall": "isojax.tasks.recall"}

def family(name: str):
  if name not in _MODULES:
    raise ValueError(f"task.name={name!r}: expected one of {list(NAMES)}")
  return importlib.import_module(_MODULES[name])


def validate(task: TaskSettings) -> None:
  """Family-specific field checks; reads no data and compiles nothing."""
  family(task.name).validate(task)


def load(task: TaskSettings) -> TaskData:
  """Train and validation problems: a named profiled split, or the family's own;
  at most `task.max_train_problems` training problems when that is set."""
  return limit_train(_load(task), task.max_train_problems, task.seed)


def _load(task: TaskSettings) -> TaskData:
  if task.split:
    return TaskData(*splits.load_split(task.splits_dir, task.split))
  return family(task.name).load(task)


def limit_train(data: TaskData, max_train: int, seed: int) -> TaskData:
  """The first `max_train` training problems of a shuffle fixed by `seed` (all of
  them when max_train is 0 or not smaller); nested: a smaller limit keeps a subset
  of a larger one's problems. Validation is untouched."""
  if max_train <= 0 or max_train >= len(data.train):
    return data
  order = np.random.default_rng([seed, 0x5E7]).permutation(len(data.train))
  return dataclasses.replace(data, train=[data.train[i] for i in order[:max_train]])


def make_verifier(task: TaskSettings) -> Verifier:
  return family(task.name).make_verifier(task)


def default_instruction(task: TaskSettings) -> str:
  if task.instruction is not None:
    return task.instruction
  return family(task.name).DEFAULT_INSTRUCTION


def describe(data: TaskData) -> dict[str, Any]:
  return dict(num_train=len(data.train), num_val=len(data.val), skipped=data.skipped)


__all__ = ["NAMES", "PROMPT_FORMATS", "Grades", "PerItemVerifier", "Problem", "TaskData",
           "TaskSettings", "Verifier", "default_instruction", "describe", "family", "load", "make_verifier",
           "validate"]
