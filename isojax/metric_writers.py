"""Where a run's metrics are watched: TensorBoard event files and Weights & Biases.

`metrics.jsonl` (`isojax.run_dir`) stays the record: `launch.analyze` and the notebooks
read it and nothing reads these writers back. They exist because researchers watch runs
in TensorBoard or W&B. Each metrics line is sent to them as it is appended:

  * numbers become scalars under the same names as in `metrics.jsonl` (`train/reward`,
    `val/avg@4`, `rollouts`, ...), at the line's `step`;
  * the lists named in `metrics.HISTOGRAMS` (the pass@1 histogram: bucket c holds the
    problems with c of N samples correct) become histograms, not lists;
  * anything else (strings, other lists) stays in `metrics.jsonl` only.

TensorBoard event files go into the workdir itself through tensorboardX (pure Python,
no TensorFlow; `gs://` works where google-cloud-storage is installed), so
`tensorboard --logdir=<workdir>` shows a run and `--logdir=<sweep root>` a whole sweep,
each run named by its directory. A resumed run keeps `metrics.jsonl`'s contract: its
writer carries `purge_step` = the first step not covered by the restored checkpoint, so
TensorBoard hides what the interrupted attempt logged from that step on. W&B cannot
forget logged steps: a resumed run continues the same W&B run (its id is kept in the
workdir) and W&B ignores the steps it has already seen.

Only the primary process writes (`enabled=False` elsewhere).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
import uuid
from typing import Any, Protocol, Sequence

import numpy as np

from isojax import metrics, run_dir, storage, validation

F = validation.field

Scalars = dict[str, float]
Histograms = dict[str, list[int]]


def split_record(record: dict[str, Any]) -> tuple[int, Scalars, Histograms]:
  """(step, scalars, histograms) of one metrics line; other values are left out."""
  scalars, histograms = {}, {}
  for key, value in record.items():
    if key == run_dir.STEP:
      continue
    if key in metrics.HISTOGRAMS and isinstance(value, (list, tuple, np.ndarray)):
      histograms[key] = [int(c) for c in value]
    elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)):
      scalars[key] = float(value)
  return int(record[run_dir.STEP]), scalars, histograms


def histogram_stats(counts: Sequence[int]) -> dict[str, Any]:
  """A TensorBoard histogram of bucket counts: bucket c holds the value c."""
  counts = np.asarray(counts, np.float64)  # [N + 1]: problems with c = 0..N correct
  values = np.arange(counts.size, dtype=np.float64)  # [N + 1]
  filled = np.flatnonzero(counts)
  return dict(
      min=float(values[filled[0]]) if filled.size else 0.0,
      max=float(values[filled[-1]]) if filled.size else 0.0,
      num=float(counts.sum()),
      sum=float(counts @ values),
      sum_squares=float(counts @ values**2),
      bucket_limits=(values + 0.5).tolist(),  # bucket c spans (c - 0.5, c + 0.5]
      bucket_counts=counts.tolist())


class Writer(Protocol):
  """A place metrics lines are sent to: TensorBoard, W&B."""

  def write(self, step: int, scalars: Scalars, histograms: Histograms) -> None:
    ...

  def close(self) -> None:
    ...


class TensorBoardWriter:
  """Event files in `logdir`, flushed after every line (a crash loses nothing).

  Written as Summary protos through tensorboardX's FileWriter rather than its
  SummaryWriter, whose add_scalar renames tags ("val/avg@4" -> "val/avg_4"): the tags
  are metrics.jsonl's keys.
  """

  def __init__(self, logdir: str, resume_step: int | None):
    try:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      from tensorboardX import summary  # pylint: disable=g-import-not-at-top
      from tensorboardX.proto import event_pb2, summary_pb2  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("metric_writers.tensorboard=True needs tensorboardX (an install "
                        "requirement of isojax: `pip install -e .`); or set "
                        "--config.metric_writers.tensorboard=False") from e
    self._summary, self._summary_pb2 = summary, summary_pb2
    # The ns suffix orders (and separates) files opened in the same second.
    self._writer = tensorboardX.FileWriter(logdir, filename_suffix=f".{time.time_ns()}")
    # TensorBoard hides earlier events at or after the step of a START status event: a fresh run
    # hides everything before it in logdir, a resumed one what followed its checkpoint
    # (the purge_step of tensorboardX's SummaryWriter).
    purge_step = 0 if resume_step is None else resume_step + 1
    self._writer.add_event(event_pb2.Event(step=purge_step, file_version="brain.Event:2"))
    self._writer.add_event(event_pb2.Event(step=purge_step, session_log=event_pb2.SessionLog(
        status=event_pb2.SessionLog.START)))

  def write(self, step: int, scalars: Scalars, histograms: Histograms) -> None:
    Summary = self._summary_pb2.Summary  # pylint: disable=invalid-name
    values = [Summary.Value(tag=name, simple_value=value) for name, value in scalars.items()]
    for name, counts in histograms.items():
      values += self._summary.histogram_raw(name, **histogram_stats(counts)).value
    self._writer.add_summary(Summary(value=values), global_step=step)
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


class WandbWriter:
  """One W&B run per workdir, continued when the run resumes."""

  def __init__(self, settings: MetricWritersSettings, workdir: str,
               resume_step: int | None, run_config: dict[str, Any] | None):
    try:
      import wandb  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ImportError("metric_writers.wandb=True needs the wandb package, which is not "
                        "installed: `pip install wandb`, or set "
                        "--config.metric_writers.wandb=False") from e
    self._wandb = wandb
    id_file = storage.path(workdir) / run_dir.WANDB_RUN_ID_FILE
    if resume_step is not None and id_file.exists():
      run_id = id_file.read_text().strip()
    else:
      run_id = uuid.uuid4().hex[:16]
      storage.write_text(id_file, run_id)
    local = not storage.is_uri(workdir)  # W&B keeps its files on a local disk only
    self._run = wandb.init(
        project=settings.wandb_project, entity=settings.wandb_entity or None,
        name=settings.wandb_name or os.path.basename(os.path.normpath(workdir)),
        id=run_id, resume="allow", config=run_config, dir=workdir if local else None)

  def write(self, step: int, scalars: Scalars, histograms: Histograms) -> None:
    data: dict[str, Any] = dict(scalars)
    for name, counts in histograms.items():
      edges = np.arange(len(counts) + 1) - 0.5  # bucket c spans [c - 0.5, c + 0.5)
      data[name] = self._wandb.Histogram(np_histogram=(np.asarray(counts), edges))
    self._run.log(data, step=step)

  def close(self) -> None:
    self._run.finish()


@dataclasses.dataclass(frozen=True)
class MetricWritersSettings(validation.Section):
  """`config.metric_writers`: where metrics are watched besides `metrics.jsonl` (the
  record analysis reads) ([run_directory.md](run_directory.md))."""
  tensorboard: bool = F(True, "TensorBoard event files in the workdir")
  wandb: bool = F(False, "W&B (`pip install -e \".[wandb]\"`)")
  wandb_project: str = F("isojax", "W&B project")
  wandb_entity: str = F("", "`\"\"` = your default entity")
  wandb_name: str = F("", "`\"\"` = the workdir's name")

  def __post_init__(self):
    for field in ("tensorboard", "wandb"):
      validation.boolean(f"metric_writers.{field}", getattr(self, field))
    if self.wandb and importlib.util.find_spec("wandb") is None:
      raise ValueError("metric_writers.wandb=True but the wandb package is not installed: "
                       "`pip install wandb`, or set --config.metric_writers.wandb=False")
    if self.wandb and not self.wandb_project:
      raise ValueError("metric_writers.wandb=True needs metric_writers.wandb_project")


class MetricWriters:
  """Sends each metrics line to every enabled writer."""

  def __init__(self, writers: Sequence[Writer] = ()):
    self.writers = list(writers)

  def write(self, record: dict[str, Any]) -> None:
    if not self.writers:
      return
    step, scalars, histograms = split_record(record)
    for writer in self.writers:
      writer.write(step, scalars, histograms)

  def close(self) -> None:
    for writer in self.writers:
      writer.close()
    self.writers = []


def create(settings: MetricWritersSettings, workdir: str, *, resume_step: int | None,
           enabled: bool = True, run_config: dict[str, Any] | None = None) -> MetricWriters:
  """The writers `settings` enables; none when not
  `enabled`. `resume_step`: the restored checkpoint's step (None for a fresh run)."""
  workdir = str(workdir)
  writers: list[Writer] = []
  if enabled and settings.tensorboard:
    writers.append(TensorBoardWriter(workdir, resume_step))
  if enabled and settings.wandb:
    writers.append(WandbWriter(settings, workdir, resume_step, run_config))
  return MetricWriters(writers)
