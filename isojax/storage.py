"""Every run, split, sweep and analysis file is read and written here, through one path
abstraction, so a `gs://` workdir works wherever a local one does.

Paths are `etils.epath` paths, the abstraction orbax already uses for checkpoints:
local paths go to `os`, `gs://` and `s3://` URIs to fsspec (`gcsfs`, `s3fs`) or
`tf.io.gfile`, whichever is installed. Two rules make the same code right on both:

  - `write_text` / `write_json` are the one atomic writer: they write a temporary file
    in the target's directory and rename it over the target, so a reader (or a run
    killed mid-write) never sees half a file.
  - Nothing is appended to: object stores cannot append (gcsfs silently overwrites),
    so a file that grows (metrics.jsonl) is rewritten whole through the writer.

`absolute` and `is_uri` exist because `os.path.abspath` would turn "gs://b/x" into
"<cwd>/gs:/b/x".
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any, Union

from etils import epath

PathLike = Union[str, os.PathLike]


def path(p: PathLike) -> epath.Path:
  """`p` as an epath.Path, with a leading `~` expanded (local paths only have one)."""
  return epath.Path(p).expanduser()


def is_uri(p: PathLike) -> bool:
  """True for object-store URIs such as gs://bucket/dir, False for local paths."""
  return "://" in os.fspath(p)


def absolute(p: PathLike) -> str:
  """A local path made absolute (with `~` expanded); a URI unchanged."""
  p = os.fspath(p)
  return p if is_uri(p) else os.path.abspath(os.path.expanduser(p))


def json_default(x: Any) -> Any:
  """JSON for NumPy / JAX scalars and arrays (`json.dumps(..., default=json_default)`)."""
  if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
    return x.item()
  if hasattr(x, "tolist"):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_text(target: PathLike, text: str) -> epath.Path:
  """Writes `text` to `target` atomically (temporary file + rename); makes parents."""
  target = path(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  # A unique hidden name: two writers of one file never share a temporary file.
  tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
  try:
    tmp.write_text(text)
    tmp.replace(target)
  except BaseException:
    if tmp.exists():
      tmp.unlink()
    raise
  return target


def write_json(target: PathLike, obj: Any, **dump_kwargs) -> epath.Path:
  """Writes `obj` as JSON atomically; `dump_kwargs` go to json.dumps (default indent 1).

  NumPy / JAX scalars and arrays are written as numbers and lists.
  """
  dump_kwargs.setdefault("indent", 1)
  dump_kwargs.setdefault("default", json_default)
  return write_text(target, json.dumps(obj, **dump_kwargs))


def read_json(source: PathLike) -> Any:
  """The JSON in `source`; errors name the file.

  Raises FileNotFoundError when it does not exist and ValueError when it is not JSON.
  """
  source = path(source)
  if not source.is_file():
    raise FileNotFoundError(f"{source}: does not exist")
  try:
    return json.loads(source.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{source}: not valid JSON ({e})") from e
