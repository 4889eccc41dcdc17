"""A checkpoint directory's files read by their headers and sizes, never their weights.

A run checks its model before it locks or writes its workdir, so a damaged checkpoint
(a partial copy, an interrupted download, a hand-edited config) fails naming the file,
and the tensor, instead of as a reshape error deep inside the loader after the workdir
is written. Nothing here reads weights: a 7B checkpoint is checked in milliseconds.

The safetensors format is an 8-byte little-endian header length, a JSON header of
{name: {dtype, shape, data_offsets}} (offsets into the data that follows) and the raw
bytes. The `safetensors` package is the judge of a file's layout (its `safe_open`
refuses overlaps, gaps and trailing bytes), but its errors name neither the file nor
the tensor ("incomplete metadata, file not fully covered"); the header is read here as
well, to say which tensor a truncation cut and what its size should be.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Any

import ml_dtypes
import numpy as np

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"

# safetensors dtype codes that isojax reads -> NumPy dtypes (ml_dtypes for bfloat16,
# which NumPy lacks; real Qwen/Llama checkpoints are bfloat16).
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
          "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32}
# The `safetensors` crate refuses headers above 100 MB: a larger length is not a header.
MAX_HEADER_BYTES = 100_000_000
LAYOUT = ("a safetensors file: an 8-byte header length, a JSON header of {name: {dtype, "
          "shape, data_offsets}}, then the tensor data")


class CheckpointFileError(ValueError):
  """A model checkpoint's files cannot be used; the message names the file (and the
  tensor or field)."""


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  file: str
  dtype: str
  shape: tuple[int, ...]
  offset: int  # the tensor's first byte in the file
  nbytes: int


def read_json(file: str, expected: str) -> Any:
  """The JSON document in `file`; a parse error names the file, line and column."""
  try:
    with open(file, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
                     f"expected {expected}") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{file}: not UTF-8 text (byte {e.start}); expected {expected}") from None


def read_json_object(file: str, expected: str) -> dict[str, Any]:
  value = read_json(file, expected)
  if not isinstance(value, dict):
    raise ValueError(f"{file}: a JSON {type(value).__name__}; expected {expected}")
  return value


def _header(file: str, size: int) -> tuple[dict[str, Any], int]:
  """(the JSON header, where the data starts): checked against the file's size."""
  with open(file, "rb") as f:
    head = f.read(8)
    if len(head) < 8:
      raise ValueError(f"{file}: {size} bytes, truncated inside the 8-byte header length; "
                       f"expected {LAYOUT}")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_HEADER_BYTES:
      raise ValueError(f"{file}: its first 8 bytes ({head!r}) give a header of {length} "
                       f"bytes: not a safetensors file; expected {LAYOUT}")
    if 8 + length > size:
      raise ValueError(f"{file}: truncated inside its JSON header: the header ends at byte "
                       f"{8 + length}, the file at byte {size}; expected the complete file")
    text = f.read(length)
  try:
    header = json.loads(text)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{file}: the JSON header ({length} bytes) does not parse ({e}); "
                     f"expected {LAYOUT}") from None
  if not isinstance(header, dict):
    raise ValueError(f"{file}: the header is a JSON {type(header).__name__}; expected {LAYOUT}")
  return header, 8 + length


def _tensor(file: str, name: str, info: Any, data_start: int) -> TensorInfo:
  """One header entry, checked: a dtype isojax reads, a shape, offsets that fit it."""
  if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
    raise ValueError(f"{file}: tensor {name!r} has header entry {info!r}; expected "
                     "{dtype, shape, data_offsets}")
  dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
  if dtype not in DTYPES:
    raise ValueError(f"{file}: tensor {name!r} has dtype {dtype!r}; expected one of "
                     f"{sorted(DTYPES)}")
  if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
    raise ValueError(f"{file}: tensor {name!r} has shape {shape!r}; expected a list of "
                     "sizes")
  if not (isinstance(offsets, list) and len(offsets) == 2
          and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
    raise ValueError(f"{file}: tensor {name!r} has data_offsets {offsets!r}; expected "
                     "[begin, end] with 0 <= begin <= end")
  nbytes = math.prod(shape) * np.dtype(DTYPES[dtype]).itemsize
  if offsets[1] - offsets[0] != nbytes:
    raise ValueError(f"{file}: tensor {name!r} ({dtype}, shape {tuple(shape)}) is {nbytes} "
                     f"bytes, but its data_offsets {offsets} span {offsets[1] - offsets[0]}")
  return TensorInfo(file, dtype, tuple(shape), data_start + offsets[0], nbytes)


def safetensors_header(file: str) -> dict[str, TensorInfo]:
  """The tensors of one .safetensors file, each checked against the file's size.

  Raises naming the file, and the first tensor (in file order) a truncation cut.
  """
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file}: missing; expected {LAYOUT}")
  size = os.path.getsize(file)
  header, data_start = _header(file, size)
  header.pop("__metadata__", None)
  tensors = {name: _tensor(file, name, info, data_start) for name, info in header.items()}
  for t_name, t in sorted(tensors.items(), key=lambda item: item[1].offset):
    if t.offset + t.nbytes > size:
      raise ValueError(f"{file}: truncated inside tensor {t_name!r} ({t.dtype}, shape "
                       f"{t.shape}): its data ends at byte {t.offset + t.nbytes}, the file "
                       f"at byte {size}; expected the complete file")
  _library_check(file)
  return tensors


def _library_check(file: str) -> None:
  """The `safetensors` package's own checks of the layout (overlaps, gaps, trailing
  bytes), its error given the file's name."""
  from safetensors import SafetensorError, safe_open  # pylint: disable=g-import-not-at-top
  try:
    with safe_open(file, framework="numpy"):
      pass
  except SafetensorError as e:
    raise ValueError(f"{file}: {e}; expected {LAYOUT}, each tensor's bytes in order with "
                     "nothing between or after them") from None


def weight_files(path: str) -> list[str]:
  """The .safetensors files of checkpoint directory `path`: model.safetensors, or the
  shards its index lists (checked to exist)."""
  index = os.path.join(path, WEIGHTS_INDEX)
  if os.path.exists(index):
    weight_map = _weight_map(index)
    files = sorted(set(weight_map.values()))
    for name, shard in weight_map.items():
      if not os.path.isfile(os.path.join(path, shard)):
        raise FileNotFoundError(f"{index}: tensor {name!r} is in {shard}, but "
                                f"{os.path.join(path, shard)} does not exist")
    return [os.path.join(path, f) for f in files]
  if os.path.exists(os.path.join(path, WEIGHTS_FILE)):
    return [os.path.join(path, WEIGHTS_FILE)]
  raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX}; expected the "
                          "weights beside config.json")


def _weight_map(index: str) -> dict[str, str]:
  expected = 'a safetensors index: {"weight_map": {tensor name: shard file}}'
  weight_map = read_json_object(index, expected).get("weight_map")
  if not (isinstance(weight_map, dict) and weight_map
          and all(isinstance(v, str) for v in weight_map.values())):
    raise ValueError(f"{index}: weight_map is {weight_map!r}; expected {expected}")
  return weight_map


def tensor_headers(path: str) -> dict[str, TensorInfo]:
  """Every tensor of checkpoint directory `path`, from the headers of its files."""
  tensors: dict[str, TensorInfo] = {}
  for file in weight_files(path):
    for name, info in safetensors_header(file).items():
      if name in tensors:
        raise ValueError(f"{file}: tensor {name!r} is also in {tensors[name].file}; "
                         "expected each tensor in one file")
      tensors[name] = info
  index = os.path.join(path, WEIGHTS_INDEX)
  if os.path.exists(index):
    for name, shard in _weight_map(index).items():
      if tensors.get(name) is None or tensors[name].file != os.path.join(path, shard):
        raise ValueError(f"{index}: lists tensor {name!r} in {shard}, whose header has no "
                         "such tensor")
  return tensors
