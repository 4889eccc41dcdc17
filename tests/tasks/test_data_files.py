"""Bad data files: every error names the file, the line or row, and what was expected.

Each of JSONL, JSON, Parquet, CSV and Arrow is written empty, malformed, with text
that is not UTF-8, and as binary data under its extension, then read through
`math_data.load` as a run reads it. A row far too long to be a prompt is dropped by
its length, and `train.run` refuses every bad file before its workdir exists.
"""

import glob
import json
import re
import socket

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from isojax import tasks
from isojax.base_models import demo_bases
from isojax.config import config_lib
from isojax.models import tokenizer as tokenizer_lib
from isojax.tasks import data_files, math_data, prompts

ROWS = [dict(question=f"What is {i} plus 1?", answer=f"#### {i + 1}") for i in range(6)]
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
  """No network and a throwaway HF cache (a cached table must not hide a fault)."""
  def refuse(*args, **kwargs):
    raise OSError("the math loader must not use the network")
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE",
                      str(tmp_path_factory.mktemp("hf_cache")))


def _task(path, **fields):
  task = config_lib.base_config().task
  task.update(name="math", format="gsm8k", train_files=str(path), num_val=1, num_train=0,
              seed=0, **fields)
  return task


def _not_utf8(text_rows):
  """Arrow strings whose third value holds a Latin-1 byte (pyarrow checks none)."""
  values = [r.encode() for r in text_rows]
  values[2] = values[2].replace(b"What", b"Wh\xe9t")
  offsets = np.cumsum([0] + [len(v) for v in values]).astype(np.int32)
  return pa.Array.from_buffers(pa.string(), len(values),
                               [None, pa.py_buffer(offsets.tobytes()),
                                pa.py_buffer(b"".join(values))])


def _table(bad_text=False):
  questions = [r["question"] for r in ROWS]
  return pa.table({"question": _not_utf8(questions) if bad_text else questions,
                   "answer": [r["answer"] for r in ROWS]})


def _arrow_bytes(table, path, batch_rows=None):
  with pa.ipc.new_stream(str(path), table.schema) as writer:
    for batch in table.to_batches(max_chunksize=batch_rows):
      writer.write_batch(batch)
  return path.read_bytes()


def _jsonl():
  return "".join(json.dumps(r) + "\n" for r in ROWS)


def _csv():
  return "question,answer\n" + "".join(f"{r['question']},{r['answer']}\n" for r in ROWS)


def _write(tmp_path, ext, fault):
  """Writes a file of type `ext` with `fault`; returns (path, regex its error must match)."""
  path = tmp_path / f"data{ext}"
  if fault == "empty":
    path.write_bytes(b"")
    return path, r"empty file \(0 bytes\)"
  if fault == "binary":
    path.write_bytes(PNG)
    what = "not a text file" if ext in data_files.TEXT else "not an? (Parquet|Arrow) file"
    return path, what + r" \(a PNG image\)"
  if fault == "not_utf8":
    if ext in (".parquet", ".arrow"):
      table = _table(bad_text=True)
      pq.write_table(table, path) if ext == ".parquet" else _arrow_bytes(table, path)
      return path, r"row 3, column 'question': not UTF-8 text"
    text = {".jsonl": _jsonl(), ".json": json.dumps(ROWS, indent=1), ".csv": _csv()}[ext]
    data = text.encode().replace(b"What is 2", b"Wh\xe9t is 2")
    path.write_bytes(data)
    line = data[:data.index(b"\xe9")].count(b"\n") + 1
    return path, rf"line {line}, byte \d+: not UTF-8 text \(byte 0xe9"
  assert fault == "malformed"
  if ext == ".jsonl":
    lines = _jsonl().splitlines(keepends=True)
    path.write_text("".join(lines[:2]) + '{"question": "x", answer: 3}\n' + "".join(lines[2:]))
    return path, r"line 3, column 19: not valid JSON \(Expecting property name"
  if ext == ".json":
    path.write_text(json.dumps(ROWS, indent=1).replace('"#### 3"', "#### 3"))
    return path, r"line \d+, column 13: not valid JSON \(Expecting value\)"
  if ext == ".csv":
    path.write_text(_csv().replace("What is 2 plus 1?,", "What is 2, plus 1?,"))
    return path, (r"line 4: 3 fields; expected at most 2, one per column of the header "
                  r"\(question, answer\)")
  if ext == ".parquet":
    pq.write_table(_table(), path, row_group_size=3, compression="snappy")
    data = bytearray(path.read_bytes())
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    start = column.dictionary_page_offset or column.data_page_offset
    data[start + 20:start + column.total_compressed_size - 4] = b"\xab" * (
        column.total_compressed_size - 24)
    path.write_bytes(bytes(data))
    return path, r"row group 1 \(rows 4-6\) cannot be read"
  data = _arrow_bytes(_table(), path, batch_rows=3)
  path.write_bytes(data[:-60])  # inside the second record batch
  return path, r"record batch 1 \(rows from 4\) is cut short or damaged"


@pytest.mark.parametrize("fault", ["empty", "malformed", "not_utf8", "binary"])
@pytest.mark.parametrize("ext", [".jsonl", ".json", ".parquet", ".csv", ".arrow"])
def test_a_bad_file_names_itself_its_line_or_row_and_what_was_expected(tmp_path, ext, fault):
  path, where = _write(tmp_path, ext, fault)
  with pytest.raises(data_files.DataFileError) as raised:
    math_data.load(_task(path))
  message = str(raised.value)
  assert message.startswith(str(path)), message
  assert re.search(where, message), message
  assert message.endswith(f"; expected {data_files.EXPECTED[ext]}") or (
      "expected UTF-8 strings" in message), message


@pytest.mark.parametrize("content,where", [
    (b"\n  \n\n", r"no rows \(only blank lines\)"),
    (_jsonl().encode() + b"[1, 2]\n", "line 7: a JSON array, not an object"),
    (b"\x00\x01" + _jsonl().encode(), r"not a text file \(a NUL byte at byte 1"),
])
def test_jsonl_faults_beyond_a_bad_line(tmp_path, content, where):
  path = tmp_path / "data.jsonl"
  path.write_bytes(content)
  with pytest.raises(data_files.DataFileError, match=rf"^{path}: {where}"):
    math_data.load(_task(path))


@pytest.mark.parametrize("content,where", [
    (b"[]", "an empty JSON array: no rows"),
    (b'"text"', "the document is a JSON string, not an array of objects"),
    (json.dumps(ROWS + ["x"]).encode(), "row 7 of the array: a JSON string, not an object"),
])
def test_json_documents_that_are_not_rows(tmp_path, content, where):
  path = tmp_path / "data.json"
  path.write_bytes(content)
  with pytest.raises(data_files.DataFileError, match=rf"^{path}: {where}"):
    math_data.load(_task(path))


def test_a_truncated_parquet_file_is_refused_by_its_last_bytes(tmp_path):
  path = tmp_path / "data.parquet"
  pq.write_table(_table(), path)
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(data_files.DataFileError,
                     match=rf"^{path}: truncated or damaged: .* does not end with the 'PAR1'"):
    math_data.load(_task(path))


@pytest.mark.parametrize("damage,where", [
    (lambda data: data[:-200], "is cut short or damaged"),
    (lambda data: PNG, r"not an Arrow file \(a PNG image\)"),
])
def test_a_damaged_arrow_file_of_a_save_to_disk_directory_is_named(tmp_path, damage, where):
  directory = tmp_path / "saved"
  datasets.Dataset.from_list(ROWS).save_to_disk(str(directory))
  (arrow,) = glob.glob(str(directory / "*.arrow"))
  with open(arrow, "rb") as f:
    data = f.read()
  with open(arrow, "wb") as f:
    f.write(damage(data))
  with pytest.raises(data_files.DataFileError, match=rf"^{arrow}: .*{where}"):
    math_data.load(_task(directory))


class _Recording:
  """A `tokenizers.Tokenizer` that records the length of every text it encodes."""

  def __init__(self, inner):
    self._inner, self.lengths = inner, []

  def encode(self, text, *args, **kwargs):
    self.lengths.append(len(text))
    return self._inner.encode(text, *args, **kwargs)

  def __getattr__(self, name):
    return getattr(self._inner, name)


def test_a_50_mb_row_is_dropped_as_too_long_without_being_tokenized(tmp_path):
  """Tokenizing it took 77 s (and gigabytes); its length alone says it cannot fit."""
  huge = "Add these: " + "1+" * 25_000_000 + "1"
  path, val = tmp_path / "data.jsonl", tmp_path / "val.jsonl"
  path.write_text(_jsonl() + json.dumps(dict(question=huge, answer="#### 3")) + "\n")
  val.write_text(json.dumps(dict(question="What is 9 plus 9?", answer="#### 18")) + "\n")
  task = tasks.TaskSettings.from_config(
      _task(path, val_files=str(val), prompt_format="plain").to_dict())
  tok = tokenizer_lib.load_tokenizer(demo_bases.shipped_dir("reasoning_gym"))
  tok.tokenizer = _Recording(tok.tokenizer)
  loaded = prompts.load_task(task, tok, problems_per_batch=2)
  assert loaded.skipped == {"prompt_over_max_prompt_tokens": 1}
  assert len(loaded.train) == len(ROWS) and len(loaded.val) == 1
  assert tok.tokenizer.lengths and max(tok.tokenizer.lengths) < 1000
  assert loaded.book.max_len < task.max_prompt_tokens
