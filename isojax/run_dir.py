"""The layout of one run directory: the contract between the main loop and analysis.

    <workdir>/config.json      the resolved config of the run (JSON object)
    <workdir>/metrics.jsonl    one JSON object per line, one line per logged step
    <workdir>/checkpoints/     orbax checkpoints (only the main loop reads them)
    <workdir>/checkpoints/corrupt/<step>  checkpoints that failed to restore, moved aside
    <workdir>/events.out.tfevents.*  TensorBoard's copy of metrics.jsonl, and
    <workdir>/wandb_run_id, wandb/   W&B's run id and files (`isojax.metric_writers`)

Every metrics line carries `step`, `rollouts` (cumulative sampled rollouts, the
compute C), `tokens` (cumulative generated tokens) and `wall_s`, plus namespaced
metrics such as `train/reward` or `val/avg@4` (names in `isojax.metrics`). Lines with an
`event` key record what happened rather than what was measured (a corrupt checkpoint
skipped, a divergence that stopped the run): `read_metrics` leaves them out and
`read_events` returns them.

Readers (`launch.analyze`, notebooks) use `load_run` / `find_runs`; they raise
`RunFormatError` naming the file so callers can report and skip a broken run.
<workdir> is a local path or a URI such as gs://bucket/run: every file goes through
`isojax.storage` (etils.epath): every rewrite is atomic, and a local metrics.jsonl
grows by appended lines (`MetricsWriter`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from typing import Any, Callable, Iterable

from etils import epath

from isojax import metrics, storage

CONFIG_FILE = "config.json"
CONFIG_HISTORY_FILE = "config_history.jsonl"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
CORRUPT_DIR = "corrupt"  # under CHECKPOINT_DIR, where orbax does not look
SUPERSEDED_DIR = "superseded"  # likewise
PARTIAL_CHECKPOINT = ".orbax-checkpoint-tmp"  # in the name of a save orbax has not finished
WANDB_RUN_ID_FILE = "wandb_run_id"  # one W&B run per workdir, kept across resumes
# Keys that every metrics line has, in this order.
STEP, ROLLOUTS, TOKENS, WALL_S = "step", "rollouts", "tokens", "wall_s"
REQUIRED_KEYS = (STEP, ROLLOUTS, TOKENS, WALL_S)
EVENT = "event"  # the key of event lines (names in isojax.metrics: EVENT_*)


class RunFormatError(ValueError):
  """A run directory whose files are missing or malformed."""


@dataclasses.dataclass(frozen=True)
class Run:
  path: str
  config: dict[str, Any]
  metrics: list[dict[str, Any]]

  def series(self, name: str) -> tuple[list[float], list[float]]:
    """(rollouts, values) of the lines that logged `name` (finite values only)."""
    xs, ys = [], []
    for line in self.metrics:
      value = line.get(name)
      if isinstance(value, (int, float)) and math.isfinite(value):
        xs.append(float(line[ROLLOUTS]))
        ys.append(float(value))
    return xs, ys


def config_path(workdir: storage.PathLike) -> epath.Path:
  return storage.path(workdir) / CONFIG_FILE


def metrics_path(workdir: storage.PathLike) -> epath.Path:
  return storage.path(workdir) / METRICS_FILE


def checkpoint_dir(workdir: storage.PathLike) -> epath.Path:
  """Absolute, as orbax requires (a gs:// workdir already is)."""
  return storage.path(storage.absolute(workdir)) / CHECKPOINT_DIR


def keep_the_last_checkpoint(workdir: str) -> tuple[list[int], int | None]:
  """Removes a finished run's checkpoints but its newest step (the one an extension
  trains on from) and any partial save; returns (the steps removed, the step kept).
  The earlier ones (step 0, the one kept from before a collapse, the newest's fallback)
  serve only a run still going. Checkpoints moved aside as damaged or superseded are
  left for a person. A local workdir (the local sweep backend's)."""
  ckpt_dir = str(checkpoint_dir(workdir))
  names = os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir) else []
  steps = sorted(int(n) for n in names if n.isdigit())
  partial = [n for n in names if PARTIAL_CHECKPOINT in n]
  for name in [str(step) for step in steps[:-1]] + partial:
    shutil.rmtree(os.path.join(ckpt_dir, name))
  return steps[:-1], (steps[-1] if steps else None)


def corrupt_checkpoint_dir(workdir: storage.PathLike) -> epath.Path:
  return checkpoint_dir(workdir) / CORRUPT_DIR


def superseded_checkpoint_dir(workdir: storage.PathLike) -> epath.Path:
  return checkpoint_dir(workdir) / SUPERSEDED_DIR


def config_history_path(workdir: storage.PathLike) -> epath.Path:
  return storage.path(workdir) / CONFIG_HISTORY_FILE


def write_config(workdir: storage.PathLike, config: dict[str, Any]) -> None:
  """Writes config.json and drops any settings history: the workdir's run starts here."""
  storage.write_json(config_path(workdir), config, indent=2, sort_keys=True)
  history = config_history_path(workdir)
  if history.exists():
    history.unlink()


def read_config_history(workdir: storage.PathLike) -> list[dict[str, Any]]:
  """The lines of config_history.jsonl, oldest first ([] when there is none)."""
  path = config_history_path(workdir)
  if not path.exists():
    return []
  lines = []
  for lineno, line in enumerate(path.read_text().splitlines(), start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise RunFormatError(f"{path}:{lineno}: not valid JSON ({e})") from e
    if not isinstance(record, dict) or not isinstance(record.get(STEP), int):
      raise RunFormatError(f"{path}:{lineno}: expected a JSON object with an integer "
                           f"{STEP!r}")
    lines.append(record)
  return lines


def append_config_history(workdir: storage.PathLike, record: dict[str, Any]) -> None:
  """Adds a line to config_history.jsonl (the file is rewritten whole, atomically:
  object stores cannot append)."""
  path = config_history_path(workdir)
  before = path.read_text() if path.exists() else ""
  storage.write_text(path, before + _line(record))


def read_config(workdir: storage.PathLike) -> dict[str, Any]:
  path = config_path(workdir)
  try:
    config = storage.read_json(path)
  except FileNotFoundError as e:
    raise RunFormatError(f"{e} (every run directory has a {CONFIG_FILE})") from e
  except ValueError as e:
    raise RunFormatError(str(e)) from e
  if not isinstance(config, dict):
    raise RunFormatError(f"{path}: expected a JSON object, got {type(config).__name__}")
  return config


def _line(record: dict[str, Any]) -> str:
  return json.dumps(record, default=storage.json_default) + "\n"


class MetricsWriter:
  """Writes metrics lines; on resume drops the lines after the restored step.

  A local file grows by one appended line per `write` (`storage.append_text`), so a
  line costs the same at step 60,000 as at step 1. An object store cannot append: there
  the file is rewritten whole (atomically), at most every `rewrite_every_s` seconds
  (0: at every line), at every event line and at every `flush`. A caller that sets
  `rewrite_every_s` flushes before anything relies on the file: the training loop before
  each checkpoint and at the end, so a resume from any checkpoint finds every line
  before it.
  With `enabled=False` (every process but the first of a multi-host job) it writes
  nothing, so one file has one line per step whatever the number of hosts.
  """

  def __init__(self, workdir: storage.PathLike, resume_step: int | None = None,
               enabled: bool = True, rewrite_every_s: float = 0.0):
    self.enabled = enabled
    self.path = metrics_path(workdir)
    self._appends = not storage.is_uri(self.path)
    self._rewrite_every_s = rewrite_every_s
    self._lines: list[str] = []  # an object store's whole file; nothing when appending
    self._unwritten = False
    self._rewritten_at = time.monotonic()
    if not enabled:
      return
    kept = []
    if resume_step is not None and self.path.exists():
      kept = [_line(r) for r in _read_lines(workdir) if r[STEP] <= resume_step]
    storage.write_text(self.path, "".join(kept))
    if not self._appends:
      self._lines = kept

  def write(self, record: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
      raise ValueError(f"metrics record lacks required keys {missing}: {record}")
    if not self.enabled:
      return
    if self._appends:
      storage.append_text(self.path, _line(record))
      return
    self._lines.append(_line(record))
    self._unwritten = True
    # An event (a checkpoint skipped, settings changed) is not logged again on a rerun.
    if EVENT in record or time.monotonic() - self._rewritten_at >= self._rewrite_every_s:
      self.flush()

  def flush(self) -> None:
    """Writes the lines an object store's file does not hold yet (appends never wait)."""
    if self._unwritten:
      storage.write_text(self.path, "".join(self._lines))
      self._unwritten = False
      self._rewritten_at = time.monotonic()


_REPAIR = "repair or delete that line (nothing in the run directory was changed)"


def _parse_line(path: epath.Path, lineno: int | str, line: str) -> dict[str, Any]:
  """One metrics line; errors name the file and the line (its number, or where it is)."""
  try:
    record = json.loads(line)
  except json.JSONDecodeError as e:
    raise RunFormatError(f"{path}:{lineno}: not valid JSON ({e}); {_REPAIR}") from e
  if not isinstance(record, dict):
    raise RunFormatError(f"{path}:{lineno}: expected a JSON object; {_REPAIR}")
  missing = [k for k in REQUIRED_KEYS if k not in record]
  if missing:
    raise RunFormatError(f"{path}:{lineno}: missing required keys {missing}; {_REPAIR}")
  return record


def _read_lines(workdir: storage.PathLike) -> list[dict[str, Any]]:
  """The file's lines. A line counts once its newline is written: the unfinished last
  line of a file being appended to, read mid-write, is left out."""
  path = metrics_path(workdir)
  if not path.is_file():
    raise RunFormatError(f"{path}: missing (every run directory has a {METRICS_FILE})")
  return [_parse_line(path, lineno, line)
          for lineno, line in enumerate(_finished(path.read_text()), start=1)
          if line.strip()]


def _finished(text: str) -> list[str]:
  """The lines of `text` whose newline is written, and a last one without it that is
  whole JSON (a file written by hand); blank lines stay, so line numbers hold."""
  *finished, last = text.split("\n")
  if last.strip():
    try:
      json.loads(last)
      finished.append(last)
    except json.JSONDecodeError:
      pass  # an unfinished line, being appended to
  return finished


def _last_line(workdir: storage.PathLike, keep: Callable[[dict[str, Any]], bool]
               ) -> dict[str, Any] | None:
  """The last line of metrics.jsonl that `keep` accepts (None when none does), read from
  the file's end in growing windows: a run of 65,536 steps has as many lines."""
  path = metrics_path(workdir)
  if not path.is_file():
    raise RunFormatError(f"{path}: missing (every run directory has a {METRICS_FILE})")
  with path.open("rb") as f:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    span = 1 << 16
    while True:
      f.seek(max(0, size - span))
      data = f.read()
      if span < size:  # the window's first line (and character) may start before it
        data = data.partition(b"\n")[2]
      try:
        text = data.decode()
      except UnicodeDecodeError as e:
        raise RunFormatError(f"{path}: not UTF-8 near its end ({e})") from e
      found = [r for r in (_parse_line(path, "a line near its end", t)
                           for t in _finished(text) if t.strip()) if keep(r)]
      if found or span >= size:
        return found[-1] if found else None
      span *= 4


def last_metrics(workdir: storage.PathLike) -> dict[str, Any] | None:
  """The last measurement line of metrics.jsonl (None when it has none)."""
  return _last_line(workdir, lambda r: EVENT not in r)


def last_line(workdir: storage.PathLike) -> dict[str, Any] | None:
  """The last line of metrics.jsonl, measurement or event (None when it is empty)."""
  return _last_line(workdir, lambda r: True)


def read_metrics(workdir: storage.PathLike) -> list[dict[str, Any]]:
  """The measurement lines of metrics.jsonl, event lines left out."""
  return [r for r in _read_lines(workdir) if EVENT not in r]


def read_events(workdir: storage.PathLike) -> list[dict[str, Any]]:
  """The event lines of metrics.jsonl ({'step': ..., 'event': ..., 'message': ...})."""
  return [r for r in _read_lines(workdir) if EVENT in r]


def load_run(workdir: storage.PathLike) -> Run:
  return Run(path=os.fspath(workdir), config=read_config(workdir), metrics=read_metrics(workdir))


def find_runs(root: storage.PathLike) -> list[str]:
  """Every directory under `root` (itself included) holding a config or metrics file."""
  top = storage.path(root)
  if not top.is_dir():
    raise FileNotFoundError(f"runs directory {os.fspath(root)!r} does not exist")
  found = []
  for dirpath, dirnames, filenames in top.walk():
    dirnames[:] = sorted(d for d in dirnames if d != CHECKPOINT_DIR)
    if CONFIG_FILE in filenames or METRICS_FILE in filenames:
      found.append(os.fspath(dirpath))
  return sorted(found)


def iter_loaded_runs(paths: Iterable[str]):
  """Yields (path, Run or RunFormatError) so callers can report bad runs by name."""
  for path in paths:
    try:
      yield path, load_run(path)
    except RunFormatError as e:
      yield path, e


def without_timings(record: dict) -> dict:
  """A metrics line without its wall-clock and memory fields (all that differs between two
  equal runs: the memory plan's estimate follows the machine's memory)."""
  return {k: v for k, v in record.items()
          if k != WALL_S and not k.startswith((metrics.TIME_PREFIX, metrics.MEMORY_PREFIX))}
