"""A data file that its reader refuses, read again to name the line or row at fault.

`datasets`, and pyarrow, pandas and ujson beneath it, report a bad data file as "An
error occurred while generating the dataset", a bare `StopIteration` or "Expected
object or value at position 36": the file appears at best in an earlier log line, the
line never. The math loader lets the library read each file; when it fails, `explain`
reads the file again, with the standard library (json, csv) or pyarrow one row group
or record batch at a time, and says which file, which line or row, and what was
expected there. Two faults are caught before the library is asked, from a file's size
and first bytes (`check`): an empty file, and a file that is not data of its kind (a
binary file named .jsonl, a JSON file named .parquet). A row that loads but holds
text that is not UTF-8 is named by `bad_row` when the loader reaches it.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Any, Iterator

# File extension -> what such a file must hold, for the messages.
EXPECTED = {
    ".jsonl": "JSON Lines: one JSON object per line, in UTF-8",
    ".json": "a JSON array of objects, one per row (or JSON Lines), in UTF-8",
    ".csv": "UTF-8 CSV: a header line naming the columns, then one row per line",
    ".parquet": "a Parquet file",
    ".arrow": "an Arrow IPC stream or file (as Dataset.save_to_disk writes)",
}
TEXT = (".jsonl", ".json", ".csv")
# Leading bytes of formats a data file may really be: what to call it.
MAGIC = {b"PAR1": "a Parquet file", b"ARROW1": "an Arrow file",
         b"\xff\xff\xff\xff": "an Arrow stream", b"\x1f\x8b": "a gzip file",
         b"PK\x03\x04": "a zip archive", b"\x28\xb5\x2f\xfd": "a zstd file",
         b"BZh": "a bzip2 file", b"\xfd7zXZ": "an xz file", b"\x89PNG": "a PNG image",
         b"%PDF": "a PDF document", b"SQLite format 3": "an SQLite database"}


class DataFileError(ValueError):
  """A data file the loader cannot read; the message names the file and, where the
  fault was found, its line or row (`located`)."""

  def __init__(self, message: str, located: bool = True):
    super().__init__(message)
    self.located = located


def _ext(path: str) -> str:
  return os.path.splitext(path)[1].lower()


def _kind(head: bytes) -> str | None:
  return next((name for magic, name in MAGIC.items() if head.startswith(magic)), None)


def check(path: str) -> None:
  """Refuses an empty file, or one whose first (and last) bytes are not its format's."""
  ext, size = _ext(path), os.path.getsize(path)
  expected = EXPECTED[ext]
  if size == 0:
    raise DataFileError(f"{path}: empty file (0 bytes); expected {expected}")
  with open(path, "rb") as f:
    head = f.read(4096)
    f.seek(max(size - 4, 0))
    tail = f.read(4)
  kind = _kind(head)
  looks = kind or f"it starts with {head[:8]!r}"
  if ext in TEXT and (kind or b"\0" in head):
    what = kind or f"a NUL byte at byte {head.index(0) + 1}: binary data, or UTF-16 text"
    raise DataFileError(f"{path}: not a text file ({what}); expected {expected}")
  if ext == ".parquet" and not head.startswith(b"PAR1"):
    raise DataFileError(f"{path}: not a Parquet file ({looks}); expected {expected}")
  if ext == ".parquet" and (size < 12 or tail != b"PAR1"):
    raise DataFileError(f"{path}: truncated or damaged: it starts like a Parquet file but "
                        f"does not end with the 'PAR1' marker ({size} bytes); expected the "
                        "complete file")
  if ext == ".arrow" and not head.startswith((b"ARROW1", b"\xff\xff\xff\xff")):
    raise DataFileError(f"{path}: not an Arrow file ({looks}); expected {expected}")


def explain(path: str, error: BaseException) -> DataFileError:
  """The error to raise for `path`, which the library failed to read with `error`."""
  ext = _ext(path)
  finder = {".jsonl": _jsonl_fault, ".json": _json_fault, ".csv": _csv_fault,
            ".parquet": _parquet_fault, ".arrow": _arrow_fault}[ext]
  try:
    fault = finder(path)
  except _Fault as f:
    fault = str(f)
  if fault:
    return DataFileError(f"{path}: {fault}; expected {EXPECTED[ext]}")
  cause = error.__cause__ or error  # datasets wraps the reader's error in its own
  return DataFileError(f"{path}: cannot be read ({type(cause).__name__}: {cause}); expected "
                       f"{EXPECTED[ext]}", located=False)


class _Fault(Exception):
  """Where a file goes wrong, e.g. "line 3, byte 7: not UTF-8 text"."""


def _json_type(value: Any) -> str:
  return {dict: "object", list: "array", str: "string", bool: "boolean",
          type(None): "null"}.get(type(value), "number")


def _text_lines(path: str) -> Iterator[tuple[int, str]]:
  """(line number from 1, text) of each line; raises _Fault at the first non-UTF-8 byte."""
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      try:
        yield number, raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise _Fault(f"line {number}, byte {e.start + 1}: not UTF-8 text (byte "
                     f"0x{raw[e.start]:02x}; re-encode the file, e.g. iconv -f latin1 -t "
                     "utf-8)") from None


def utf8_fault(path: str) -> str | None:
  """The first line of text file `path` that is not UTF-8, as "line L, byte B: ..."."""
  try:
    for _ in _text_lines(path):
      pass
  except _Fault as f:
    return str(f)
  return None


def _jsonl_fault(path: str) -> str | None:
  rows = 0
  for number, line in _text_lines(path):
    if not line.strip():
      continue
    rows += 1
    try:
      value = json.loads(line)
    except json.JSONDecodeError as e:
      return f"line {number}, column {e.colno}: not valid JSON ({e.msg})"
    if not isinstance(value, dict):
      return f"line {number}: a JSON {_json_type(value)}, not an object"
  return None if rows else "no rows (only blank lines)"


def _json_fault(path: str) -> str | None:
  fault = utf8_fault(path)
  if fault:
    return fault
  with open(path, encoding="utf-8") as f:
    text = f.read()
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    if e.msg == "Extra data":  # several documents: JSON Lines, which datasets reads too
      return _jsonl_fault(path)
    return f"line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})"
  if isinstance(value, list):
    if not value:
      return "an empty JSON array: no rows"
    for number, row in enumerate(value, 1):
      if not isinstance(row, dict):
        return f"row {number} of the array: a JSON {_json_type(row)}, not an object"
    return None
  if isinstance(value, dict):
    return None
  return f"the document is a JSON {_json_type(value)}, not an array of objects"


def _csv_fault(path: str) -> str | None:
  fault = utf8_fault(path)
  if fault:
    return fault
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.reader(f, strict=True)
    try:
      header = next(reader, None)
      if not header or not any(c.strip() for c in header):
        return "line 1: no header naming the columns"
      for record in reader:
        if len(record) > len(header):  # pandas fills short rows; longer ones it refuses
          return (f"line {reader.line_num}: {len(record)} fields; expected at most "
                  f"{len(header)}, one per column of the header ({', '.join(header)})")
    except csv.Error as e:
      return f"line {reader.line_num}: {e}"
  return None


def _parquet_fault(path: str) -> str | None:
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel
  try:
    parquet = pq.ParquetFile(path)
  except Exception as e:  # pylint: disable=broad-except  # pyarrow: OSError, ArrowInvalid
    return f"damaged: its metadata cannot be read ({str(e).strip()})"
  first = 1
  for group in range(parquet.num_row_groups):
    rows = parquet.metadata.row_group(group).num_rows
    try:
      parquet.read_row_group(group)
    except Exception as e:  # pylint: disable=broad-except
      return (f"row group {group} (rows {first}-{first + rows - 1}) cannot be read "
              f"({str(e).strip()})")
    first += rows
  return None


def _arrow_fault(path: str) -> str | None:
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  with open(path, "rb") as f:
    try:
      batches = iter(pa.ipc.open_stream(f))
    except (OSError, pa.ArrowInvalid):
      f.seek(0)
      try:
        reader = pa.ipc.open_file(f)
      except (OSError, pa.ArrowInvalid) as e:
        return f"not a readable Arrow stream or file ({e})"
      batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
    first, index = 1, 0
    while True:
      try:
        batch = next(batches)
      except StopIteration:
        return None
      except (OSError, pa.ArrowInvalid) as e:
        return (f"record batch {index} (rows from {first}) is cut short or damaged "
                f"({str(e).strip()})")
      try:
        batch.validate(full=True)
      except pa.ArrowInvalid as e:
        return _bad_arrow_row(batch, first) or f"record batch {index} (from row {first}): {e}"
      first, index = first + batch.num_rows, index + 1


def _bad_arrow_row(batch, first: int) -> str | None:
  """The first cell of `batch` that fails validation (text that is not UTF-8)."""
  import pyarrow as pa  # pylint: disable=import-outside-toplevel
  for row in range(batch.num_rows):
    for name in batch.schema.names:
      try:
        batch.column(name).slice(row, 1).validate(full=True)
      except pa.ArrowInvalid as e:
        what = "not UTF-8 text" if "UTF8" in str(e) else "invalid"
        return f"row {first + row}, column {name!r}: {what} ({e})"
  return None


def bad_row(name: str, path: str | None, table, start: int, stop: int,
            error: UnicodeDecodeError) -> DataFileError:
  """The error for rows [start, stop) of pyarrow `table` (read from `path`, None for a
  save_to_disk directory), which hold text that is not UTF-8."""
  if path is not None and _ext(path) in TEXT:
    fault = utf8_fault(path)
    if fault:
      return DataFileError(f"{path}: {fault}; expected {EXPECTED[_ext(path)]}")
  for row in range(start, stop):
    for column in table.column_names:
      try:
        table.column(column)[row].as_py()
      except UnicodeDecodeError as e:
        return DataFileError(f"{name} row {row + 1}, column {column!r}: not UTF-8 text (byte "
                             f"{e.start + 1}); expected UTF-8 strings")
  return DataFileError(f"{name} rows {start + 1}-{stop}: {error}", located=False)
