"""Math problems from local files or a prepared TFDS dataset: the `math` family's input.

Public math sets (GSM8K, MATH / MATH-500, DAPO-Math-17k, Polaris, DeepScaleR) ship as
JSONL / JSON / Parquet / CSV / Arrow files, `datasets.save_to_disk` directories or TFDS
datasets (read by `math_sources`), each with its own column names and its own way of
writing the gold answer.
This module turns any of them into `Problem(prompt=question, answer=gold)`, so the RL
loop, splits and profiling see one shape. A format is a row of data in `MAPPINGS`, not
a branch in the loop.

It reads local data only: `datasets` is put in offline mode and TFDS never downloads,
so a run on a machine without Hub access fails at once with the path it could not
find, instead of stalling on network retries. Rows that cannot be used (no question,
no answer, a gold answer `math-verify` cannot parse, a repeated question) are skipped
and counted in the `TaskData` it returns, with the first few row numbers of each reason, for the
caller to log; a source that yields nothing raises, and so does a list-valued cell
with several values (naming its file and row). A file the library cannot read (empty,
a malformed line, text that is not UTF-8, binary data under a data extension) raises
naming the file, the line or row and what was expected there (`data_files`).
"""

from __future__ import annotations


import numpy as np
from absl import logging

from isojax.tasks import math_grading, math_sources, math_verifier
from isojax.tasks.math_fields import MAPPINGS, Column, MultipleValues, mapping_for
from isojax.tasks.problem import Problem, TaskData
from isojax.tasks.settings import TaskSettings

# The papers' boxed-answer instruction, appended to each question when
# `task.instruction` is unset.
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# Skipped rows named per reason (the rest are counted only).
EXAMPLES_PER_REASON = 5


# ----------------------------------------------------------------------- validation


def validate(task: TaskSettings) -> None:
  """Checks the task fields without reading data, so a bad config fails before compiling."""
  if task.format not in MAPPINGS:
    raise ValueError(f"task.format={task.format!r}: expected one of {sorted(MAPPINGS)}")
  if task.format == "generic" and not (task.question_field and task.answer_field):
    raise ValueError(
        "task.format='generic' needs both task.question_field and task.answer_field "
        f"(got {task.question_field!r}, {task.answer_field!r})")
  if bool(task.train_files) == bool(task.tfds_name):
    raise ValueError(
        "the math task needs exactly one training source: task.train_files (local files "
        "or a save_to_disk directory) or task.tfds_name (with task.data_dir); got "
        f"train_files={task.train_files!r}, tfds_name={task.tfds_name!r}")
  if task.tfds_name and not task.data_dir:
    raise ValueError(f"task.tfds_name={task.tfds_name!r} needs task.data_dir, the local "
                     "directory the dataset was prepared in (downloads are off)")
  for field in ("num_train", "num_val"):
    value = getattr(task, field)
    if not isinstance(value, int) or value < 0:
      raise ValueError(f"task.{field}={value!r}: expected an integer >= 0")


# ------------------------------------------------------------------------ problems


def _present(side: tuple[Column, ...], table: math_sources.Table, what: str,
             task: TaskSettings) -> tuple[Column, ...]:
  """The side's columns that this table has; raises naming the table if it has none."""
  present = tuple(c for c in side if c.name in table.columns)
  if not present:
    names = [c.name for c in side]
    raise ValueError(
        f"{table.name}: task.format={task.format!r} reads the {what} from column "
        f"{' or '.join(map(repr, names))} (override with task.{what}_field), but the "
        f"file has columns {list(table.columns)}")
  return present


def _first(columns: tuple[Column, ...], row: dict, where: str) -> str | None:
  for column in columns:
    try:
      text = column.extract(row[column.name])
    except MultipleValues as e:
      raise ValueError(f"{where}: column {column.name!r} {e}") from None
    if text is not None:
      return text
  return None


def _problems(tables: list[math_sources.Table], task: TaskSettings, role: str,
              skipped: dict[str, int], exclude: frozenset[str] = frozenset(),
              skipped_rows: dict[str, list[str]] | None = None) -> list[Problem]:
  """The usable rows of `tables` in file order, each question once.

  Rows are skipped, and counted in `skipped` under "<role>/<reason>" (the first few
  named in `skipped_rows`, "<file> row <i>" counting from 1), when they have no
  question, repeat an earlier question (or one in `exclude`, the validation set), have
  no answer, or have a gold answer math-verify cannot parse (no completion could ever
  be graded correct against it). A table that yields nothing raises.
  """
  skipped_rows = {} if skipped_rows is None else skipped_rows
  mapping = mapping_for(task)
  problems, seen = [], set(exclude)
  for table in tables:
    questions = _present(mapping.question, table, "question", task)
    answers = _present(mapping.answer, table, "answer", task)
    counts = dict.fromkeys(("missing_question", "duplicate_question", "in_val",
                            "missing_answer", "unparseable_answer"), 0)
    kept = 0
    for index, row in enumerate(table.rows(tuple(c.name for c in questions + answers)), 1):
      where = f"{table.name} row {index}"
      question = _first(questions, row, where)
      # The question is checked first and the gold parsed last: sets like DAPO-Math-17k
      # repeat each problem many times, and parsing is the slow step.
      reason = ("missing_question" if question is None else
                "in_val" if question in exclude else
                "duplicate_question" if question in seen else None)
      if reason is None:
        answer = _first(answers, row, where)
        reason = ("missing_answer" if answer is None else
                  "unparseable_answer" if math_grading.parse_gold(answer) is None
                  else None)
      if reason is not None:
        counts[reason] += 1
        named = skipped_rows.setdefault(f"{role}/{reason}", [])
        if len(named) < EXAMPLES_PER_REASON:
          named.append(where)
        continue
      seen.add(question)
      problems.append(Problem(prompt=question, answer=answer, difficulty=0, meta=""))
      kept += 1
    nonzero = {k: v for k, v in counts.items() if v}
    if not kept:
      raise ValueError(f"{table.name}: no usable {role} problems with task.format="
                       f"{task.format!r}; rows skipped by reason: {nonzero or 'none (empty)'}")
    for reason, n in nonzero.items():
      skipped[f"{role}/{reason}"] = skipped.get(f"{role}/{reason}", 0) + n
  return problems


def _subset(n: int, size: int, seed: int, stream: int) -> list[int]:
  """Sorted indices of a seeded subset of `n` out of `size` (all if n is 0 or >= size).

  A prefix of one seeded permutation, so a larger `n` keeps every index a smaller one
  chose, and `stream` keeps the held-out draw independent of the training cap.
  """
  if not n or n >= size:
    return list(range(size))
  order = np.random.default_rng([seed, stream]).permutation(size)
  return sorted(order[:n].tolist())


def _hold_out(pool: list[Problem], num_val: int, seed: int
              ) -> tuple[list[Problem], list[Problem]]:
  """Splits `pool` (questions already distinct) into (train, val) deterministically."""
  if num_val >= len(pool):
    raise ValueError(f"task.num_val={num_val}: only {len(pool)} usable problems to hold "
                     "out from; lower it or give task.val_files")
  val_idx = set(_subset(num_val, len(pool), seed, stream=0)) if num_val else set()
  return ([p for i, p in enumerate(pool) if i not in val_idx],
          [p for i, p in enumerate(pool) if i in val_idx])


def load(task: TaskSettings) -> TaskData:
  """Train and validation problems, and the rows skipped (the first
  EXAMPLES_PER_REASON of each reason named), from the sources and mapping that `task`
  names.

  Validation comes from task.val_files, or task.val_split of the training source, or
  else task.num_val problems held out of the training set by task.seed. No question is
  in both sets. task.num_train caps training (0: all) and task.num_val caps a separate
  validation source (0: all), each by a seeded subset in file order.
  """
  validate(task)
  skipped: dict[str, int] = {}
  rows: dict[str, list[str]] = {}
  train_tables = math_sources.train_tables(task)
  val_tables = math_sources.val_tables(task)
  if val_tables is None:
    pool = _problems(train_tables, task, "train", skipped, skipped_rows=rows)
    train, val = _hold_out(pool, task.num_val, task.seed)
    logging.info("task math: no validation source (task.val_files, task.val_split): "
                 "held out task.num_val=%d of the %d usable problems of %s as validation "
                 "(seed %d); %d remain for training", len(val), len(pool),
                 ", ".join(t.name for t in train_tables), task.seed, len(train))
  else:
    all_val = _problems(val_tables, task, "val", skipped, skipped_rows=rows)
    val = [all_val[i] for i in _subset(task.num_val, len(all_val), task.seed, stream=0)]
    # Every question of the validation source is kept out of training, capped or not.
    train = _problems(train_tables, task, "train", skipped,
                      exclude=frozenset(p.prompt for p in all_val), skipped_rows=rows)
  train = [train[i] for i in _subset(task.num_train, len(train), task.seed, stream=1)]
  for reason, named in rows.items():
    more = skipped[reason] - len(named)
    logging.warning("task math: skipped %d row(s) for %s: %s%s", skipped[reason], reason,
                    ", ".join(named), f" and {more} more" if more else "")
  return TaskData(train, val, skipped, rows)


def make_verifier(task: TaskSettings) -> math_verifier.MathVerifier:
  """`math-verify` in worker processes, with a per-completion timeout."""
  return math_verifier.MathVerifier(pattern=task.answer_pattern,
                                    timeout_s=task.verifier_timeout_s,
                                    workers=task.verifier_workers)