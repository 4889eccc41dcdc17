"""The layout of one run directory: the contract between the main loop and analysis.

    <workdir>/config.json      the resolved config of the run (JSON object)
    <workdir>/metrics.jsonl    one JSON object per line, one line per logged step
    <workdir>/checkpoints/     orbax checkpoints (only the main loop reads them)

Every metrics line carries `step`, `rollouts` (cumulative sampled rollouts, the
compute C), `tokens` (cumulative generated tokens) and `wall_s`, plus namespaced
metrics such as `train/reward` or `val/avg@4` (names in `isojax.metrics`).

Readers (`launch.analyze`, notebooks) use `load_run` / `find_runs`; they raise
`RunFormatError` naming the file so callers can report and skip a broken run.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Iterable

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
CHECKPOINT_DIR = "checkpoints"
# Keys that every metrics line has, in this order.
STEP, ROLLOUTS, TOKENS, WALL_S = "step", "rollouts", "tokens", "wall_s"
REQUIRED_KEYS = (STEP, ROLLOUTS, TOKENS, WALL_S)


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


def config_path(workdir: str) -> str:
  return os.path.join(workdir, CONFIG_FILE)


def metrics_path(workdir: str) -> str:
  return os.path.join(workdir, METRICS_FILE)


def checkpoint_dir(workdir: str) -> str:
  return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def _json_default(x):
  if hasattr(x, "item"):  # NumPy / JAX scalars
    return x.item()
  if hasattr(x, "tolist"):
    return x.tolist()
  raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def write_config(workdir: str, config: dict[str, Any]) -> None:
  os.makedirs(workdir, exist_ok=True)
  tmp = config_path(workdir) + ".tmp"
  with open(tmp, "w") as f:
    json.dump(config, f, indent=2, sort_keys=True, default=_json_default)
  os.replace(tmp, config_path(workdir))  # never leave a half-written config


def read_config(workdir: str) -> dict[str, Any]:
  path = config_path(workdir)
  if not os.path.isfile(path):
    raise RunFormatError(f"{path}: missing (every run directory has a {CONFIG_FILE})")
  try:
    with open(path) as f:
      config = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RunFormatError(f"{path}: not valid JSON ({e})") from e
  if not isinstance(config, dict):
    raise RunFormatError(f"{path}: expected a JSON object, got {type(config).__name__}")
  return config


class MetricsWriter:
  """Appends metrics lines; on resume drops the lines after the restored step.

  With `enabled=False` (every process but the first of a multi-host job) it writes
  nothing, so one file has one line per step whatever the number of hosts.
  """

  def __init__(self, workdir: str, resume_step: int | None = None, enabled: bool = True):
    self.enabled = enabled
    self.path = metrics_path(workdir)
    if not enabled:
      return
    os.makedirs(workdir, exist_ok=True)
    if resume_step is None:
      open(self.path, "w").close()
    elif os.path.exists(self.path):
      kept = [r for r in read_metrics(workdir) if r[STEP] <= resume_step]
      with open(self.path, "w") as f:
        f.writelines(json.dumps(r, default=_json_default) + "\n" for r in kept)

  def write(self, record: dict[str, Any]) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
      raise ValueError(f"metrics record lacks required keys {missing}: {record}")
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(record, default=_json_default) + "\n")


def read_metrics(workdir: str) -> list[dict[str, Any]]:
  path = metrics_path(workdir)
  if not os.path.isfile(path):
    raise RunFormatError(f"{path}: missing (every run directory has a {METRICS_FILE})")
  records = []
  with open(path) as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise RunFormatError(f"{path}:{lineno}: not valid JSON ({e})") from e
      if not isinstance(record, dict):
        raise RunFormatError(f"{path}:{lineno}: expected a JSON object")
      missing = [k for k in REQUIRED_KEYS if k not in record]
      if missing:
        raise RunFormatError(f"{path}:{lineno}: missing required keys {missing}")
      records.append(record)
  return records


def load_run(workdir: str) -> Run:
  return Run(path=workdir, config=read_config(workdir), metrics=read_metrics(workdir))


def find_runs(root: str) -> list[str]:
  """Every directory under `root` (itself included) holding a config or metrics file."""
  if not os.path.isdir(root):
    raise FileNotFoundError(f"runs directory {root!r} does not exist")
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d != CHECKPOINT_DIR)
    if CONFIG_FILE in filenames or METRICS_FILE in filenames:
      found.append(dirpath)
  return sorted(found)


def iter_loaded_runs(paths: Iterable[str]):
  """Yields (path, Run or RunFormatError) so callers can report bad runs by name."""
  for path in paths:
    try:
      yield path, load_run(path)
    except RunFormatError as e:
      yield path, e
