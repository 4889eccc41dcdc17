"""From run directories to the (compute, metric) curves the fits consume.

A run's evaluations are noisy; the IsoCompute paper's workflow keeps only its
*record-breaking points*: bucketise the metric into bins of a fixed width and
keep the first evaluation at which the run's bin rises above every earlier bin.
Bucketing is order-preserving, so the upper envelope of a sweep (the frontier)
built from record points equals the one built from all points, at bin
resolution, while the fits no longer chase dips of a single evaluation.

Runs that share an allocation (B_p, n), e.g. several seeds or budgets of one
configuration, are pooled into one `Curve`: the metric-vs-compute curve of a
configuration does not depend on how long it was run (constant LR after warm-up).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable

import numpy as np

from isojax import run_dir

# Allocation fields of a run's config.json (the names of `isojax.config.run_settings.RunSettings`).
N_FIELD = "rollouts_per_problem"
B_P_FIELD = "problems_per_batch"
DEFAULT_BIN_WIDTH = 0.01  # in metric units: 1 point of accuracy


def record_breaking_mask(values_E, bin_width: float = DEFAULT_BIN_WIDTH) -> np.ndarray:
  """[E] bool: True where the run's metric bin first exceeds all earlier bins.

  `values_E` is in evaluation (compute) order. The first evaluation is always a
  record. Bins are floor(value / bin_width); bin_width <= 0 keeps every strict
  improvement of the running maximum.
  """
  v_E = np.asarray(values_E, np.float64).ravel()
  if v_E.size == 0:
    return np.zeros(0, bool)
  if bin_width > 0:
    # The small offset keeps values sitting exactly on a bin edge (0.3 / 0.01)
    # in the bin they name despite floating-point division.
    level_E = np.floor(v_E / bin_width + 1e-9)
  else:
    level_E = v_E
  best_before_E = np.concatenate([[-np.inf], np.maximum.accumulate(level_E)[:-1]])
  return level_E > best_before_E


@dataclasses.dataclass(frozen=True)
class RunCurve:
  """One run's evaluations of one metric, in compute order."""
  path: str
  problems_per_batch: int
  rollouts_per_problem: int
  rollouts_E: np.ndarray   # [E] cumulative rollouts at each evaluation
  values_E: np.ndarray     # [E] the metric

  @property
  def key(self) -> tuple[int, int]:
    return (self.problems_per_batch, self.rollouts_per_problem)

  def records(self, bin_width: float = DEFAULT_BIN_WIDTH) -> "RunCurve":
    mask = record_breaking_mask(self.values_E, bin_width)
    return dataclasses.replace(self, rollouts_E=self.rollouts_E[mask],
                               values_E=self.values_E[mask])


@dataclasses.dataclass(frozen=True)
class Curve:
  """The pooled curve of one allocation (B_p, n) over the runs that used it."""
  problems_per_batch: int
  rollouts_per_problem: int
  paths: tuple[str, ...]
  rollouts_E: np.ndarray   # [E] sorted ascending
  values_E: np.ndarray     # [E]

  @property
  def key(self) -> tuple[int, int]:
    return (self.problems_per_batch, self.rollouts_per_problem)

  @property
  def batch_rollouts(self) -> int:
    return self.problems_per_batch * self.rollouts_per_problem


def _allocation_field(config: dict, field: str, path: str) -> int:
  value = config.get(field)
  if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
    raise run_dir.RunFormatError(
        f"{run_dir.config_path(path)}: field {field}={value!r}, expected a positive integer")
  return value


def run_curve(run: run_dir.Run, metric: str) -> RunCurve:
  """The (rollouts, metric) series of `run`, sorted by compute.

  Raises RunFormatError when the config lacks the allocation fields; returns an
  empty curve when the run never logged `metric`.
  """
  b_p = _allocation_field(run.config, B_P_FIELD, run.path)
  n = _allocation_field(run.config, N_FIELD, run.path)
  xs, ys = run.series(metric)
  c_E, v_E = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
  if c_E.size and (not np.all(np.isfinite(c_E)) or np.any(c_E < 0)):
    raise run_dir.RunFormatError(
        f"{run_dir.metrics_path(run.path)}: `{run_dir.ROLLOUTS}` must be finite and >= 0")
  order = np.argsort(c_E, kind="stable")
  return RunCurve(path=run.path, problems_per_batch=b_p, rollouts_per_problem=n,
                  rollouts_E=c_E[order], values_E=v_E[order])


def pool_curves(run_curves: Iterable[RunCurve]) -> list[Curve]:
  """Pools runs by allocation (B_p, n); curves sorted by (B_p, n)."""
  groups: dict[tuple[int, int], list[RunCurve]] = {}
  for rc in run_curves:
    if rc.rollouts_E.size:
      groups.setdefault(rc.key, []).append(rc)
  curves = []
  for key in sorted(groups):
    members = groups[key]
    c_E = np.concatenate([m.rollouts_E for m in members])
    v_E = np.concatenate([m.values_E for m in members])
    order = np.lexsort((v_E, c_E))  # by compute, ties by value: deterministic
    curves.append(Curve(problems_per_batch=key[0], rollouts_per_problem=key[1],
                        paths=tuple(m.path for m in members),
                        rollouts_E=c_E[order], values_E=v_E[order]))
  return curves


def metric_names(runs: Iterable[run_dir.Run]) -> list[str]:
  """Sorted names of the numeric metrics that any of `runs` logged."""
  names = set()
  for run in runs:
    for line in run.metrics:
      names.update(k for k, v in line.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)
                   and math.isfinite(v))
  return sorted(names - set(run_dir.REQUIRED_KEYS))


def initial_value(run_curves: Iterable[RunCurve]) -> float | None:
  """R0 shared by a sweep: the median metric of evaluations at zero compute.

  Every run of a sweep starts from the same base model, so their evaluations
  before any update estimate one R0. None when no run evaluated at C = 0.
  """
  at_zero = [v for rc in run_curves for c, v in zip(rc.rollouts_E, rc.values_E) if c == 0]
  return float(np.median(at_zero)) if at_zero else None
