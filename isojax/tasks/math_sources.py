"""The tables a math task reads: local files (JSONL, JSON, Parquet, CSV, Arrow; paths and
globs, a comma inside a name written `\\,`), a `datasets.save_to_disk` directory, or a
prepared TFDS dataset, each as a `Table` of named columns.

Local data only: `datasets` is kept off the Hub (`HF_DATASETS_OFFLINE`, set before it is
imported) and TFDS never downloads, so a missing file fails at once with its path. A
file the library cannot read raises naming the file, line or row and what was expected
there (`data_files`). `math_data` turns the rows into problems.
"""

from __future__ import annotations

import csv
import dataclasses
import glob
import os
import re
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from isojax.tasks import data_files
from isojax.tasks.settings import TaskSettings

# Read by `datasets` when it is imported (lazily, below): local files never need the
# Hub. `setdefault`, so a person who exported the variable keeps their choice.
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


# File extension -> `datasets` packaged builder.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv",
            ".arrow": "arrow"}


@dataclasses.dataclass(frozen=True)
class Table:
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


def _read_file(path: str, builder: str) -> Table:
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
  return Table(path, tuple(ds.column_names), _dataset_rows(ds, path, path))


def _read_disk(path: str, split: str, field: str, split_field: str) -> Table:
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
  return Table(name, tuple(ds.column_names), _dataset_rows(ds, name, None))


def _read_files(spec: str, field: str, split: str, split_field: str) -> list[Table]:
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


def _read_tfds(task: TaskSettings, split: str, split_field: str) -> Table:
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
  return Table(f"tfds:{task.tfds_name}[{split}]", columns, rows)


def train_tables(task: TaskSettings) -> list[Table]:
  if task.tfds_name:
    return [_read_tfds(task, task.train_split, "task.train_split")]
  return _read_files(task.train_files, "task.train_files", task.train_split,
                     "task.train_split")


def val_tables(task: TaskSettings) -> list[Table] | None:
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
