"""Every run, split, sweep and analysis file is read and written here, through one path
abstraction, so a `gs://` workdir works wherever a local one does.

Paths are `etils.epath` paths, the abstraction orbax already uses for checkpoints:
local paths go to `os`, `gs://` and `s3://` URIs to fsspec (`gcsfs`, `s3fs`) or
`tf.io.gfile`, whichever is installed. Two rules make the same code right on both:

  - `write_text` / `write_json` are the one atomic writer: they write a temporary file
    in the target's directory and rename it over the target, so a reader (or a run
    killed mid-write) never sees half a file.
  - Only local files are appended to (`append_text`, one write each): object stores
    cannot append (gcsfs silently overwrites), so there a file that grows
    (metrics.jsonl) is rewritten whole through the atomic writer. Rewriting a local
    file at every line would cost time quadratic in its length.

A write that finds the disk full raises `NoSpace`, whose one-line message names the file,
the bytes needed and the bytes free: what `isojax.main` prints and exits with.

`absolute` and `is_uri` exist because `os.path.abspath` would turn "gs://b/x" into
"<cwd>/gs:/b/x".
"""

from __future__ import annotations

import errno
import json
import logging as std_logging
import os
import shutil
import uuid
from typing import Any, Union

from absl import logging
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


def not_a_directory(p: PathLike) -> str | None:
  """The local path at or above `p` that exists as something other than a directory
  (a directory cannot be made there), or None. Object-store paths have no files in the
  way: None."""
  if is_uri(p):
    return None
  current = os.path.abspath(os.path.expanduser(str(p)))
  while True:
    if os.path.exists(current):
      return None if os.path.isdir(current) else current
    parent = os.path.dirname(current)
    if parent == current:
      return None
    current = parent


def json_default(x: Any) -> Any:
  """JSON for NumPy / JAX scalars and arrays (`json.dumps(..., default=json_default)`)."""
  if hasattr(x, "item") and getattr(x, "ndim", 0) == 0:
    return x.item()
  if hasattr(x, "tolist"):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


class NoSpace(OSError):
  """A write that found its filesystem full; the message says what, where and how much."""


# How a full disk reads in errors that are not an OSError (tensorstore's, under orbax).
_NO_SPACE_TEXT = ("No space left on device", "os_error_code='28'")


def is_no_space(error: BaseException | None) -> bool:
  """Whether `error`, or an error it was raised from, is a full disk (ENOSPC)."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, NoSpace) or (isinstance(error, OSError)
                                      and error.errno == errno.ENOSPC):
      return True
    if any(text in str(error) for text in _NO_SPACE_TEXT):
      return True
    error = error.__cause__ or error.__context__
  return False


def free_bytes(p: PathLike) -> int | None:
  """Bytes free on the filesystem of local path `p` (or its nearest existing parent);
  None for URIs."""
  if is_uri(p):
    return None
  p = absolute(p)
  while not os.path.exists(p) and os.path.dirname(p) != p:
    p = os.path.dirname(p)
  return shutil.disk_usage(p).free


def _no_space(target: epath.Path, needed: int) -> NoSpace:
  free = free_bytes(target)
  return NoSpace(f"no space left on device writing {target}: it needs {needed:,} bytes"
                 f"{f', {free:,} are free there' if free is not None else ''}; it is as "
                 "it was before")


def write_text(target: PathLike, text: str) -> epath.Path:
  """Writes `text` to `target` atomically (temporary file + rename); makes parents.
  Raises `NoSpace` when the disk is full (the target then is as it was)."""
  target = path(target)
  # A unique hidden name: two writers of one file never share a temporary file.
  tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:12]}.tmp"
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(text)
    tmp.replace(target)
  except BaseException as e:
    if tmp.exists():
      tmp.unlink()
    if isinstance(e, OSError) and is_no_space(e):
      raise _no_space(target, len(text.encode())) from e
    raise
  return target


def append_text(target: PathLike, text: str) -> epath.Path:
  """Appends `text` to the local file `target` (created, with its parents, if missing).

  One write call, so a concurrent reader or a killed writer can leave at most the last
  line unfinished (`run_dir`'s readers leave such a line out). A full disk raises
  `NoSpace` with the file cut back to its length before. Object stores cannot append: a URI
  raises ValueError (rewrite the file with `write_text`).
  """
  if is_uri(target):
    raise ValueError(f"{target}: an object store cannot append; rewrite it whole "
                     "(storage.write_text)")
  target = path(target)
  data = text.encode()
  target.parent.mkdir(parents=True, exist_ok=True)
  fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
  try:
    size = os.fstat(fd).st_size
    try:
      written = 0
      while written < len(data):  # a short write is followed by the write that fails
        written += os.write(fd, data[written:])
    except OSError as e:
      os.ftruncate(fd, size)
      if is_no_space(e):
        raise _no_space(target, len(data)) from e
      raise
  finally:
    os.close(fd)
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


class QuietLibraries(std_logging.Filter):
  """A run's log without the libraries' noise: orbax logs every save step at INFO through
  absl; keep its warnings only. A full disk the libraries log too, with a traceback, from each of orbax's writer threads and each
  asyncio task left with the error: the save raises `storage.NoSpace`, whose one line
  says it all."""

  @classmethod
  def install(cls) -> None:
    handler = logging.get_absl_handler()
    if not any(isinstance(f, cls) for f in handler.filters):
      handler.addFilter(cls())

  def filter(self, record: std_logging.LogRecord) -> bool:
    if "/isojax/" not in record.pathname and record.levelno >= std_logging.WARNING:
      error = record.exc_info[1] if record.exc_info else None
      return not (is_no_space(error)
                  or is_no_space(Exception(record.getMessage())))
    return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname
