r"""Where each public math set keeps its question and gold answer: the `MAPPINGS` table.

A format is a row of data here, not a branch in the loader (`math_data`): each side
lists columns in order of preference, each with the extractor that turns a cell into
text (GSM8K's answer after `####`, MATH's last `\boxed{}` in a solution, DAPO's chat
message and `reward_model` struct).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from isojax.tasks import math_grading
from isojax.tasks.settings import TaskSettings

# DAPO-Math-17k wraps every question in its own instruction (answer on an `Answer:`
# line). The family adds its own instruction and reads `\boxed{}`, so the wrapper is
# removed: two conflicting instructions would cost reward for no reason.
_DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your "
                "response should be of the form Answer: $Answer (without quotes) where "
                "$Answer is the answer to the problem.\n\n")
_DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


# ------------------------------------------------------------------ cell extractors


class MultipleValues(ValueError):
  """A list-valued cell with more than one value: which one is the answer is unknown."""


def _text(value: Any) -> str | None:
  """A cell as stripped text; numbers (JSON / Parquet ints) become their decimal text.

  A list (OlympiadBench's `final_answer: ["2"]`; Parquet gives NumPy arrays) stands for
  its one element; an empty list is no value; several raise `MultipleValues`.
  """
  if isinstance(value, np.ndarray):
    value = value.tolist()
  if isinstance(value, (list, tuple)):
    if len(value) > 1:
      raise MultipleValues(f"holds {len(value)} values {list(value)[:4]}; expected one")
    value = value[0] if value else None
  if isinstance(value, bytes):  # TFDS `Text` features decode to bytes
    value = value.decode("utf-8")
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    value = str(value)
  if not isinstance(value, str) or not value.strip():
    return None
  return value.strip()


def _after_hashes(value: Any) -> str | None:
  """GSM8K: the gold follows `####` at the end of the worked solution; drop commas."""
  text = _text(value)
  if text is None or "####" not in text:
    return None
  return _text(text.rsplit("####", 1)[1].replace(",", ""))


def _boxed(value: Any) -> str | None:
  """MATH-style solutions: the gold is the last `\\boxed{...}`."""
  text = _text(value)
  return None if text is None else math_grading.extract_answer(text)


def _user_message(value: Any) -> str | None:
  """DAPO: a chat (list of {role, content}, or TFDS's columnar dict) or a plain string."""
  if isinstance(value, dict) and "role" in value:  # TFDS Sequence(FeaturesDict): columns
    value = [dict(role=r, content=c) for r, c in zip(value["role"], value["content"])]
  if isinstance(value, (list, tuple)):
    users = [m.get("content") for m in value
             if isinstance(m, dict) and _text(m.get("role")) == "user"]
    value = users[0] if users else None
  text = _text(value)
  if text is None:
    return None
  if text.startswith(_DAPO_PREFIX):
    text = text[len(_DAPO_PREFIX):]
  if text.endswith(_DAPO_SUFFIX):
    text = text[:-len(_DAPO_SUFFIX)]
  return _text(text)


def _ground_truth(value: Any) -> str | None:
  """DAPO's `reward_model` struct holds the gold in `ground_truth`."""
  return _text(value.get("ground_truth") if isinstance(value, dict) else value)


# ------------------------------------------------------------------------- mappings


@dataclasses.dataclass(frozen=True)
class Column:
  name: str
  extract: Callable[[Any], str | None] = _text  # cell -> text, None if unusable


@dataclasses.dataclass(frozen=True)
class Mapping:
  """Where a format keeps the question and the gold answer.

  Each side lists columns in order of preference; a row takes the first of them that
  the file has and that yields text, so one mapping covers a set's raw and processed
  variants (DAPO's `reward_model` struct or a flat `solution` column).
  """
  question: tuple[Column, ...]
  answer: tuple[Column, ...]


MAPPINGS = {
    # Columns come from task.question_field / task.answer_field.
    "generic": Mapping(question=(), answer=()),
    "gsm8k": Mapping((Column("question"),), (Column("answer", _after_hashes),)),
    "math": Mapping((Column("problem"),), (Column("answer"), Column("solution", _boxed))),
    "dapo": Mapping((Column("prompt", _user_message),),
                    (Column("reward_model", _ground_truth), Column("solution"),
                     Column("answer"))),
    "polaris": Mapping((Column("problem"),), (Column("answer"),)),
    "deepscaler": Mapping((Column("problem"),),
                          (Column("answer"), Column("solution", _boxed))),
}


def mapping_for(task: TaskSettings) -> Mapping:
  """The format's mapping, with task.question_field / answer_field overriding columns.

  An override names the one column to read but keeps the format's reading of it (a
  `gsm8k` answer column is still split at `####`).
  """
  mapping = MAPPINGS[task.format]
  question, answer = mapping.question, mapping.answer
  if task.question_field:
    question = (Column(task.question_field, question[0].extract if question else _text),)
  if task.answer_field:
    answer = (Column(task.answer_field, answer[0].extract if answer else _text),)
  return Mapping(question, answer)
