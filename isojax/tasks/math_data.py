"""Math problems from local files or a prepared TFDS dataset: the `math` family's input.

Public math sets (GSM8K, MATH / MATH-500, DAPO-Math-17k, Polaris, DeepScaleR) ship as
JSONL / JSON / Parquet / CSV / Arrow files, `datasets.save_to_disk` directories or TFDS
datasets, each with its own column names and its own way of writing the gold answer.
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

import csv
import dataclasses
import glob
import os
import re
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from absl import logging

from isojax.tasks import data_files, math_grading, math_verifier
from isojax.tasks.math_fields import MAPPINGS, Column, MultipleValues, mapping_for
from isojax.tasks.problem import Problem, TaskData
from isojax.tasks.settings import TaskSettings

# The papers' boxed-answer instruction, appended to each question when
# `task.instruction` is unset.
DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."

# Read by `datasets` when it is imported (lazily, below): local files never need the
# Hub. `setdefault`, so a person who exported the variable keeps their choice.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

# Skipped rows named per reason (the rest are counted only).
EXAMPLES_PER_REASON = 5

# File extension -> `datasets` packaged builder.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
            ".arrow": "arrow"}

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


# -------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class _Table:
  name: str                 # file, directory or TFDS split, for error messages
  columns: tuple[str, ...]
  rows: Callable[[tuple[str, ...]], Iterable[dict]]  # the named columns of each row


def _datasets():
  """`datasets`, imported on first use (it is slow to import) and kept off the Hub."""
  import datasets  # pylint: disable=import-outside-toplevel
  # The environment variable is read only at import; if something imported `datasets`
  # before this module, set the flag it reads at call time too.
  datasets.config.HF_HUB_OFFLINE = datasets.config.HF_DATASETS_OFFLINE = True
  return datasets


def _expand(spec: str, field: str) -> list[str]:
  """Comma-separated paths and globs -> existing paths, in order. A comma inside a name is
  written `\\,`; a spec that names an existing path whole is that one path."""
  if os.path.exists(os.path.expanduser(spec.strip())):
    return [os.path.expanduser(spec.strip())]
  paths = []
  pieces = [p.strip().replace("\\,", ",") for p in re.split(r"(?<!\\),", spec)]
  for pattern in pieces:
    if not pattern:
      continue
    pattern = os.path.expanduser(pattern)
    if glob.has_magic(pattern):
      matches = sorted(glob.glob(pattern))
      if not matches:
        raise FileNotFoundError(f"{field}: {pattern!r} matches no files")
      paths += matches
    elif os.path.exists(pattern):
      paths.append(pattern)
    else:
      hint = (" (the value is split at commas into paths; write a comma inside a name as "
              "\\,)" if len(pieces) > 1 else "")
      raise FileNotFoundError(f"{field}: {pattern} does not exist{hint}")
  if not paths:
    raise ValueError(f"{field}={spec!r} names no files")
  return paths


def _builder(paths: list[str], field: str) -> str:
  """The one `datasets` builder for these files, from their extensions."""
  builders = {}
  for path in paths:
    ext = os.path.splitext(path)[1].lower()
    if ext not in BUILDERS:
      raise ValueError(f"{field}: {path} has extension {ext!r}; expected one of "
                       f"{sorted(BUILDERS)} or a save_to_disk directory")
    builders.setdefault(BUILDERS[ext], path)
  if len(builders) > 1:
    raise ValueError(f"{field}: mixed file types ({', '.join(builders.values())}); "
                     "give files of one type (JSONL and JSON count as one)")
  return next(iter(builders))


def _dataset_rows(ds, name: str, path: str | None
                  ) -> Callable[[tuple[str, ...]], Iterator[dict]]:
  """Rows of a `datasets.Dataset`, read in column batches (row-by-row is slower).

  Text that is not UTF-8 loads (pyarrow checks it only when a cell becomes a Python
  string): the error names the file's line, or the row and column (`data_files`).
  """
  def rows(columns):
    selected = ds.select_columns(list(columns))
    for start in range(0, selected.num_rows, 1024):
      stop = min(start + 1024, selected.num_rows)
      try:
        batch = selected[start:stop]
      except UnicodeDecodeError as e:
        raise data_files.bad_row(name, path, selected.data.table, start, stop, e) from None
      for values in zip(*(batch[c] for c in columns)):
        yield dict(zip(columns, values))
  return rows


def _csv_header(path: str) -> list[str]:
  with open(path, newline="", encoding="utf-8") as f:
    return next(csv.reader(f), [])


def _read_file(path: str, builder: str) -> _Table:
  """One file through `datasets`; its errors name the file and the line or row."""
  datasets = _datasets()
  data_files.check(path)  # empty, or not data of its kind: before the library is asked
  try:
    kwargs = {}
    if builder == "csv":
      # Every column as text: pandas would otherwise read "007" as 7 and an integer
      # column with one empty cell as floats ("12.0"). Empty cells stay "" (skipped).
      kwargs = dict(features=datasets.Features(
          {c: datasets.Value("string") for c in _csv_header(path)}), keep_default_na=False)
    ds = datasets.load_dataset(
        builder, data_files=path, split="train",
        download_config=datasets.DownloadConfig(local_files_only=True), **kwargs)
  except Exception as e:  # pylint: disable=broad-except  # any reader's, even StopIteration
    error = data_files.explain(path, e)
    raise error from (None if error.located else e)
  return _Table(path, tuple(ds.column_names), _dataset_rows(ds, path, path))


def _read_disk(path: str, split: str, field: str, split_field: str) -> _Table:
  """A `save_to_disk` directory; a DatasetDict gives the split named by `split_field`."""
  datasets = _datasets()
  try:
    ds = datasets.load_from_disk(path)
  except FileNotFoundError as e:
    raise ValueError(f"{field}: {path} is a directory but not one written by "
                     f"Dataset.save_to_disk or DatasetDict.save_to_disk ({e})") from e
  except Exception as e:  # pylint: disable=broad-except  # a damaged .arrow file in it
    for file in sorted(glob.glob(os.path.join(path, "**", "*.arrow"), recursive=True)):
      data_files.check(file)
      fault = data_files.explain(file, e)
      if fault.located:
        raise fault from None
    raise ValueError(f"{field}: {path}: cannot be read as a save_to_disk directory "
                     f"({type(e).__name__}: {e})") from e
  name = path
  if isinstance(ds, datasets.DatasetDict):
    if split not in ds:
      raise ValueError(f"{split_field}={split!r}: {path} holds splits {sorted(ds)}")
    ds, name = ds[split], f"{path}[{split}]"
  return _Table(name, tuple(ds.column_names), _dataset_rows(ds, name, None))


def _read_files(spec: str, field: str, split: str, split_field: str) -> list[_Table]:
  paths = _expand(spec, field)
  dirs = [p for p in paths if os.path.isdir(p)]
  if dirs:
    if len(paths) > 1:
      raise ValueError(f"{field}: {dirs[0]} is a directory; a save_to_disk directory "
                       "must be the only entry")
    return [_read_disk(dirs[0], split, field, split_field)]
  builder = _builder(paths, field)
  # One table per file, so errors name the file at fault.
  return [_read_file(path, builder) for path in paths]


def _decode(value: Any) -> Any:
  """A TFDS record's values as Python text: bytes -> str, arrays -> lists, recursively."""
  if isinstance(value, bytes):
    return value.decode("utf-8")
  if isinstance(value, dict):
    return {k: _decode(v) for k, v in value.items()}
  if isinstance(value, np.ndarray):
    return [_decode(v) for v in value.tolist()]
  if isinstance(value, (list, tuple)):
    return [_decode(v) for v in value]
  return value


def _read_tfds(task: TaskSettings, split: str, split_field: str) -> _Table:
  """A TFDS dataset prepared as array_record under task.data_dir (no TensorFlow needed)."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
  data_dir = os.path.expanduser(task.data_dir)
  # TFDS keeps a prepared "name[/config][:version]" under data_dir/name[/config].
  prepared = os.path.join(data_dir, task.tfds_name.split(":")[0])
  if not os.path.isdir(prepared):
    raise FileNotFoundError(
        f"task.tfds_name={task.tfds_name!r}: {prepared} does not exist; prepare the "
        "dataset under task.data_dir first (downloads are off)")
  try:
    source = tfds.data_source(task.tfds_name, split=split, data_dir=data_dir,
                              download=False)
  except tfds.core.registered.DatasetNotFoundError as e:
    # TFDS's own message lists every dataset in its catalogue; the path is what matters.
    raise FileNotFoundError(
        f"task.tfds_name={task.tfds_name!r}: not prepared under task.data_dir={data_dir} "
        "(downloads are off; prepare it there first)") from e
  except NotImplementedError as e:  # prepared as TFRecord, which needs TensorFlow
    raise ValueError(
        f"task.tfds_name={task.tfds_name!r} under {data_dir} is not in a random-access "
        "format; prepare it with file_format='array_record' (TFRecord needs TensorFlow)"
        ) from e
  except ValueError as e:  # an unknown split
    raise ValueError(f"task.tfds_name={task.tfds_name!r}, {split_field}={split!r}: {e}") from e
  columns = tuple(source.dataset_info.features.keys())
  rows = lambda names: ({c: _decode(r[c]) for c in names} for r in source)
  return _Table(f"tfds:{task.tfds_name}[{split}]", columns, rows)


def _train_tables(task: TaskSettings) -> list[_Table]:
  if task.tfds_name:
    return [_read_tfds(task, task.train_split, "task.train_split")]
  return _read_files(task.train_files, "task.train_files", task.train_split,
                     "task.train_split")


def _val_tables(task: TaskSettings) -> list[_Table] | None:
  """Validation tables, or None when validation is held out of the training set."""
  if task.val_files:
    return _read_files(task.val_files, "task.val_files", task.val_split, "task.val_split")
  if not task.val_split:
    return None
  if task.tfds_name:
    return [_read_tfds(task, task.val_split, "task.val_split")]
  paths = _expand(task.train_files, "task.train_files")
  if not (len(paths) == 1 and os.path.isdir(paths[0])):
    raise ValueError(f"task.val_split={task.val_split!r} needs a DatasetDict directory "
                     f"or a TFDS dataset, but task.train_files={task.train_files!r} are "
                     "plain files; set task.val_files, or task.val_split='' to hold out")
  return [_read_disk(paths[0], task.val_split, "task.train_files", "task.val_split")]


# ------------------------------------------------------------------------ problems


def _present(side: tuple[Column, ...], table: _Table, what: str,
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


def _problems(tables: list[_Table], task: TaskSettings, role: str,
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
  train_tables = _train_tables(task)
  val_tables = _val_tables(task)
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