"""Bootstrap intervals over evaluation problems (and seeds), and verdicts from them.

Every evaluation logs the correct samples per validation problem
(`metrics.VAL_CORRECT_COUNTS`) and per histogram training problem
(`metrics.TRAIN_PASS1_COUNTS`). From those counts any of avg@k, best@k and worst@k
is a mean over problems of a per-problem value, so a bootstrap replicate of a whole
sweep is cheap: draw the problems once with replacement (the same draw for every run
and evaluation, since all runs share the problem set), average the per-problem values
of the drawn problems, and recompute the statistic (fits, frontier, n*) on the
replicate curves. When an allocation was run with several seeds, the replicate also
draws that allocation's runs with replacement.

Why by hand: the statistic is a whole analysis over many runs that share one
resampling of problems; `scipy.stats.bootstrap` resamples independent samples of one
statistic's arguments and cannot express the shared, paired draw.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from isojax import metrics
from isojax import run_dir
from isojax.planner import records

DEFAULT_RESAMPLES = 200
DEFAULT_LEVEL = 0.9             # two-sided: the 5th to the 95th percentile
YES, NO, INCONCLUSIVE = "yes", "no", "inconclusive"
_METRIC = re.compile(r"val/(avg|best|worst)@(\d+)")


@dataclasses.dataclass(frozen=True)
class ProblemCurve:
  """One run's evaluations with a per-problem value of the metric, [E, G]."""
  path: str
  problems_per_batch: int
  rollouts_per_problem: int
  seed: int
  rollouts_E: np.ndarray
  values_EG: np.ndarray

  @property
  def key(self) -> tuple[int, int]:
    return (self.problems_per_batch, self.rollouts_per_problem)

  @property
  def num_problems(self) -> int:
    return self.values_EG.shape[1]

  def curve(self, problems_G: np.ndarray | None = None) -> records.RunCurve:
    """The run's curve of the problem mean, over `problems_G` (default all)."""
    values_EG = self.values_EG if problems_G is None else self.values_EG[:, problems_G]
    return records.RunCurve(path=self.path, problems_per_batch=self.problems_per_batch,
                            rollouts_per_problem=self.rollouts_per_problem,
                            rollouts_E=self.rollouts_E, values_E=values_EG.mean(axis=1))


def per_problem_values(metric: str, counts_G, num_samples: int) -> np.ndarray:
  """The per-problem value whose mean over problems is `metric` ([G] float64).

  `metric` is val/avg@k, val/best@k or val/worst@k, "pass@1" (c / N) or
  "pass@1_extreme" (1 where pass@1 is 0 or 1: its mean is the fraction of problems
  at either end of the pass@1 histogram, the interference diagnostic).
  """
  counts_G = np.asarray(counts_G)
  if metric == "pass@1":
    return counts_G / num_samples
  if metric == "pass@1_extreme":
    return ((counts_G == 0) | (counts_G == num_samples)).astype(np.float64)
  match = _METRIC.fullmatch(metric)
  if match is None:
    raise ValueError(f"metric={metric!r}: expected val/avg@k, val/best@k, val/worst@k, "
                     "pass@1 or pass@1_extreme (per-problem counts give only these)")
  kind, k = match.group(1), int(match.group(2))
  if kind == "avg":
    return counts_G / num_samples
  if kind == "best":
    return metrics.best_at_k_per_problem(counts_G, num_samples, k)
  return metrics.worst_at_k_per_problem(counts_G, num_samples, k)


def problem_curve(run: run_dir.Run, metric: str, *,
                  counts_key: str = metrics.VAL_CORRECT_COUNTS) -> ProblemCurve:
  """`run`'s per-problem values of `metric` at every evaluation that logged counts.

  Raises RunFormatError when the run logged no per-problem counts (runs written
  before they were logged cannot be bootstrapped over problems) or when the number
  of problems changes between evaluations.
  """
  num_samples = int(run.config.get("eval", {}).get("num_samples", 0))
  if num_samples < 1:
    raise run_dir.RunFormatError(f"{run_dir.config_path(run.path)}: eval.num_samples missing")
  c_E, rows = [], []
  for line in run.metrics:
    counts = line.get(counts_key)
    if isinstance(counts, list):
      c_E.append(float(line[run_dir.ROLLOUTS]))
      rows.append(per_problem_values(metric, counts, num_samples))
  if not rows:
    raise run_dir.RunFormatError(
        f"{run_dir.metrics_path(run.path)}: no `{counts_key}` lines (per-problem counts); "
        "bootstrap intervals need runs of this isojax version")
  if len({r.size for r in rows}) != 1:
    raise run_dir.RunFormatError(
        f"{run_dir.metrics_path(run.path)}: `{counts_key}` changes length between lines")
  order = np.argsort(c_E, kind="stable")
  return ProblemCurve(path=run.path, problems_per_batch=int(run.config["problems_per_batch"]),
                      rollouts_per_problem=int(run.config["rollouts_per_problem"]),
                      seed=int(run.config.get("seed", 0)),
                      rollouts_E=np.asarray(c_E)[order], values_EG=np.stack(rows)[order])


Groups = Mapping[str, Sequence[ProblemCurve]]   # named sets of runs (e.g. variants)
Statistic = Callable[[Mapping[str, list[records.RunCurve]]], dict[str, float]]


def _replicate(groups: Groups, rng: np.random.Generator) -> dict[str, list[records.RunCurve]]:
  """One bootstrap replicate: one draw of problems shared by every run, and a draw of
  runs with replacement within each allocation that has several."""
  sizes = {c.num_problems for runs in groups.values() for c in runs}
  out = {}
  for name, runs in groups.items():
    by_key: dict[tuple[int, int], list[ProblemCurve]] = {}
    for c in runs:
      by_key.setdefault(c.key, []).append(c)
    chosen = []
    for key in sorted(by_key):
      members = by_key[key]
      picks = rng.integers(0, len(members), len(members)) if len(members) > 1 else [0]
      chosen += [members[i] for i in picks]
    out[name] = chosen
  draws = {p: rng.integers(0, p, p) for p in sorted(sizes)}
  return {name: [c.curve(draws[c.num_problems]) for c in runs] for name, runs in out.items()}


def bootstrap(groups: Groups, statistic: Statistic, *, num_resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> tuple[dict[str, float], dict[str, np.ndarray]]:
  """The statistic on the runs as measured and on `num_resamples` replicates.

  `statistic` maps {group: [RunCurve]} to named floats (NaN where undefined).
  Returns (point estimates, {name: [Z] replicate values}).
  """
  point = statistic({name: [c.curve() for c in runs] for name, runs in groups.items()})
  rng = np.random.default_rng(seed)
  samples: dict[str, list[float]] = {name: [] for name in point}
  for _ in range(num_resamples):
    values = statistic(_replicate(groups, rng))
    for name in point:
      samples[name].append(float(values.get(name, np.nan)))
  return point, {name: np.asarray(v) for name, v in samples.items()}


def interval(samples_Z, level: float = DEFAULT_LEVEL) -> tuple[float, float]:
  """The percentile interval of the finite replicates (NaN, NaN when none)."""
  finite = np.asarray(samples_Z, np.float64)
  finite = finite[np.isfinite(finite)]
  if finite.size == 0:
    return (float("nan"), float("nan"))
  tail = 50.0 * (1.0 - level)
  lo, hi = np.percentile(finite, [tail, 100.0 - tail])
  return (float(lo), float(hi))


MIN_DEFINED = 0.5  # the fraction of replicates with a value an interval needs


def effect(value: float, samples_Z, level: float = DEFAULT_LEVEL) -> dict[str, Any]:
  """{value, lo, hi, level, num_resamples, samples}: an estimate with its interval. The
  interval is undefined (NaN, so every verdict on it is inconclusive) when fewer than
  `MIN_DEFINED` of the replicates have a value: the few that do are not the estimate's
  spread but the resamples where it happened to exist."""
  samples_Z = np.asarray(samples_Z, np.float64)
  lo, hi = interval(samples_Z, level)
  if samples_Z.size and np.isfinite(samples_Z).mean() < MIN_DEFINED:
    lo = hi = float("nan")
  return {"value": float(value), "lo": lo, "hi": hi, "level": level,
          "num_resamples": int(np.isfinite(samples_Z).sum()),
          "samples": [float(x) for x in samples_Z]}


def sign_verdict(e: Mapping[str, Any], *, expected: int = 1) -> str:
  """yes when the interval lies on the expected side of 0, no when it lies on the
  other side or at 0, inconclusive when it straddles 0."""
  lo, hi = e["lo"], e["hi"]
  if not (np.isfinite(lo) and np.isfinite(hi)):
    return INCONCLUSIVE
  if expected < 0:
    lo, hi = -hi, -lo
  if lo > 0:
    return YES
  if hi <= 0:
    return NO
  return INCONCLUSIVE


def margin_verdict(e: Mapping[str, Any], margin: float) -> str:
  """For "X barely matters": yes when the interval lies within [-margin, margin],
  no when it lies wholly outside, inconclusive otherwise."""
  lo, hi = e["lo"], e["hi"]
  if not (np.isfinite(lo) and np.isfinite(hi)):
    return INCONCLUSIVE
  if -margin <= lo and hi <= margin:
    return YES
  if lo > margin or hi < -margin:
    return NO
  return INCONCLUSIVE
