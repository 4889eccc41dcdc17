"""Hierarchical bootstrap intervals (seeds, then problems), and verdicts from them.

The unit of variation for a claim about allocations is the training run: a replicate
of a whole sweep first draws, within each allocation, its seeds with replacement, then
draws the validation problems once with replacement (the same draw for every run and
evaluation, since all runs share the problem set), and recomputes the statistic (fits,
frontier, n*) on the replicate curves. Every evaluation logs the correct samples per
validation problem (`metrics.VAL_CORRECT_COUNTS`) and per histogram training problem
(`metrics.TRAIN_PASS1_COUNTS`), so any of avg@k, best@k and worst@k is a mean over
problems of a per-problem value and a replicate is cheap.

Drawing k seeds with replacement gives their mean a variance (k - 1) / k of the
seed-to-seed variance over k: with 3 seeds a 90% interval would cover about 82% of the
time. Each drawn run is therefore moved away from its allocation's mean by
sqrt(k / (k - 1)) (Davison and Hinkley's adjusted residuals), which restores the
variance; `tests/planner/test_calibration.py` measures the coverage on synthetic
sweeps with known seed and problem variance. An allocation with one seed has no seed
variance to draw: its interval measures evaluation noise on fixed policies only, and a
verdict resting on it is `INDICATIVE`, never a yes or a no.

Why by hand: the statistic is a whole analysis over many runs that share one
resampling of problems; `scipy.stats.bootstrap` resamples independent samples of one
statistic's arguments and cannot express the shared, paired draw.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Callable, Mapping, Sequence

import numpy as np
from absl import logging

from isojax import metrics
from isojax import run_dir
from isojax.planner import records

DEFAULT_RESAMPLES = 200
DEFAULT_LEVEL = 0.9             # two-sided: the 5th to the 95th percentile
YES, NO, INCONCLUSIVE, INDICATIVE = "yes", "no", "inconclusive", "indicative"
_METRIC = re.compile(r"val/(avg|best|worst)@(\d+)")
# Interference (claim 5) per problem: solved (pass@1 > 0) at the first evaluation (step
# 0, the base model), at pass@1 = 0 at this one. Its mean over problems is the fraction
# the policy lost.
LOST = "pass@1_lost"


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

  `metric` is val/avg@k, val/best@k, val/worst@k or "pass@1" (c / N). (`LOST` depends
  on the first evaluation too: `lost_problems`.)
  """
  counts_G = np.asarray(counts_G)
  if metric == "pass@1":
    return counts_G / num_samples
  match = _METRIC.fullmatch(metric)
  if match is None:
    raise ValueError(f"metric={metric!r}: expected val/avg@k, val/best@k, val/worst@k, "
                     f"pass@1 or {LOST} (per-problem counts give only these)")
  kind, k = match.group(1), int(match.group(2))
  if kind == "avg":
    return counts_G / num_samples
  if kind == "best":
    return metrics.best_at_k_per_problem(counts_G, num_samples, k)
  return metrics.worst_at_k_per_problem(counts_G, num_samples, k)


def lost_problems(counts_EG) -> np.ndarray:
  """[E, G] 1.0 where problem g had a correct sample at the first evaluation (step 0,
  the base model) and has none at e: interference as the paper means it, problems that
  fall to pass@1 = 0 from where training began, apart from problems never solved.

  Measured against the first evaluation, not against any earlier one, because the
  runs of an iso-compute sweep share only their first and last evaluations' compute: a
  log schedule of M steps rounds to fewer distinct steps when M is small (the SmolLM2
  study's n = 32 runs evaluate 7 times, its n = 2 runs 9), and "solved at any earlier
  evaluation" gives a run with more evaluations more chances to count a problem, a
  slope on log2 n that a null with the same pass rates for every n shows
  (`tests/planner/test_calibration.py`).
  """
  solved_EG = np.asarray(counts_EG) > 0
  return (solved_EG[:1] & ~solved_EG).astype(np.float64)


def problem_curve(run: run_dir.Run, metric: str, *,
                  counts_key: str = metrics.VAL_CORRECT_COUNTS) -> ProblemCurve:
  """`run`'s per-problem values of `metric` at every evaluation that logged counts.

  Raises RunFormatError when the run logged no per-problem counts (runs written
  before they were logged cannot be bootstrapped over problems), when the number
  of problems changes between evaluations, or, for `LOST`, when step 0 has no counts.
  """
  num_samples = int(run.config.get("eval", {}).get("num_samples", 0))
  if num_samples < 1:
    raise run_dir.RunFormatError(f"{run_dir.config_path(run.path)}: eval.num_samples missing")
  c_E, rows = [], []
  for line in run.metrics:
    counts = line.get(counts_key)
    if isinstance(counts, list):
      c_E.append(float(line[run_dir.ROLLOUTS]))
      rows.append(np.asarray(counts) if metric == LOST else
                  per_problem_values(metric, counts, num_samples))
  if not rows:
    raise run_dir.RunFormatError(
        f"{run_dir.metrics_path(run.path)}: no `{counts_key}` lines (per-problem counts); "
        "bootstrap intervals need runs of this isojax version")
  if len({r.size for r in rows}) != 1:
    raise run_dir.RunFormatError(
        f"{run_dir.metrics_path(run.path)}: `{counts_key}` changes length between lines")
  order = np.argsort(c_E, kind="stable")
  values_EG = np.stack(rows)[order]
  if metric == LOST:
    if min(c_E) != 0:
      raise run_dir.RunFormatError(
          f"{run_dir.metrics_path(run.path)}: interference is measured against the step-0 "
          f"evaluation, and the first `{counts_key}` line is at {min(c_E):g} rollouts")
    values_EG = lost_problems(values_EG)
  return ProblemCurve(path=run.path, problems_per_batch=int(run.config["problems_per_batch"]),
                      rollouts_per_problem=int(run.config["rollouts_per_problem"]),
                      seed=int(run.config.get("seed", 0)),
                      rollouts_E=np.asarray(c_E)[order], values_EG=values_EG)


Groups = Mapping[str, Sequence[ProblemCurve]]   # named sets of runs (e.g. variants)
Statistic = Callable[[Mapping[str, list[records.RunCurve]]], dict[str, float]]


def by_allocation(runs: Sequence[ProblemCurve]) -> dict[tuple[int, int], list[ProblemCurve]]:
  """{(B_p, n): its runs (one per seed)}, in sorted key order."""
  out: dict[tuple[int, int], list[ProblemCurve]] = {}
  for c in sorted(runs, key=lambda c: (c.key, c.seed)):
    out.setdefault(c.key, []).append(c)
  return out


def fewest_seeds(groups: Groups) -> int:
  """The fewest runs (seeds) of any allocation in `groups` (0 when there is none)."""
  return min((len(m) for runs in groups.values() for m in by_allocation(runs).values()),
             default=0)


def seed_scale(k: int) -> float:
  """sqrt(k / (k - 1)): how far from their mean k seeds drawn with replacement are moved
  so that the drawn mean has the seeds' (unbiased) variance over k."""
  return math.sqrt(k / (k - 1))


def _same_compute(members: Sequence[ProblemCurve]) -> bool:
  """Whether an allocation's seeds were evaluated at the same compute on as many
  problems (then a replicate can stack them and apply the seed correction)."""
  first = members[0]
  return all(c.values_EG.shape == first.values_EG.shape
             and np.array_equal(c.rollouts_E, first.rollouts_E) for c in members)


def uncorrected_allocations(groups: Groups) -> list[tuple[str, tuple[int, int]]]:
  """(group, (B_p, n)) of each allocation a replicate draws without the seed correction:
  several seeds not evaluated at the same compute. Intervals over them cover less than
  the nominal level, so the findings name them."""
  return [(name, key) for name, runs in groups.items()
          for key, members in by_allocation(runs).items()
          if len(members) > 1 and not _same_compute(members)]


@dataclasses.dataclass(frozen=True)
class _Allocation:
  """An allocation's runs as a replicate draws them: k seeds, moved from their mean by
  sqrt(k / (k - 1)) so the drawn mean has the seeds' variance over k. `values_KEG`
  stacks the seeds' values when they were evaluated at the same compute (None: a plain
  draw, which keeps (k - 1) / k of the seeds' variance; logged as a warning)."""
  members: tuple[ProblemCurve, ...]
  values_KEG: np.ndarray | None

  @classmethod
  def of(cls, members: Sequence[ProblemCurve]) -> _Allocation:
    if len(members) == 1:
      return cls(tuple(members), None)
    first = members[0]
    if not _same_compute(members):
      logging.warning(
          "allocation (B_p, n) = %s: its %d seeds were evaluated at different compute "
          "(%s); they are drawn without the seed correction, so intervals over them "
          "cover less than their nominal level", first.key, len(members),
          "; ".join(c.path for c in members))
      return cls(tuple(members), None)
    return cls(tuple(members), np.stack([c.values_EG for c in members]))

  def draw(self, problems: Mapping[int, np.ndarray], rng: np.random.Generator
           ) -> list[records.RunCurve]:
    k = len(self.members)
    if self.values_KEG is None:
      picks = [0] if k == 1 else rng.integers(0, k, k)
      return [self.members[i].curve(problems[self.members[i].num_problems]) for i in picks]
    picks = rng.integers(0, k, k)
    seed_KE = self.values_KEG[:, :, problems[self.values_KEG.shape[2]]].mean(axis=2)
    mean_E = seed_KE.mean(axis=0)
    moved_KE = mean_E + seed_scale(k) * (seed_KE - mean_E)
    return [records.RunCurve(path=c.path, problems_per_batch=c.problems_per_batch,
                             rollouts_per_problem=c.rollouts_per_problem,
                             rollouts_E=c.rollouts_E, values_E=moved_KE[i])
            for i, c in ((i, self.members[i]) for i in picks)]


def _layout(groups: Groups) -> dict[str, list[_Allocation]]:
  return {name: [_Allocation.of(m) for m in by_allocation(runs).values()]
          for name, runs in groups.items()}


def _replicate(layout: Mapping[str, Sequence[_Allocation]], sizes: Sequence[int],
               rng: np.random.Generator) -> dict[str, list[records.RunCurve]]:
  """One bootstrap replicate: one draw of problems shared by every run, and each
  allocation's seeds drawn with replacement (`_Allocation.draw`)."""
  problems = {p: rng.integers(0, p, p) for p in sizes}
  return {name: [c for a in allocations for c in a.draw(problems, rng)]
          for name, allocations in layout.items()}


def bootstrap(groups: Groups, statistic: Statistic, *, num_resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0) -> tuple[dict[str, float], dict[str, np.ndarray]]:
  """The statistic on the runs as measured and on `num_resamples` replicates.

  `statistic` maps {group: [RunCurve]} to named floats (NaN where undefined).
  Returns (point estimates, {name: [Z] replicate values}).
  """
  point = statistic({name: [c.curve() for c in runs] for name, runs in groups.items()})
  rng = np.random.default_rng(seed)
  layout = _layout(groups)
  sizes = sorted({c.num_problems for runs in groups.values() for c in runs})
  samples: dict[str, list[float]] = {name: [] for name in point}
  for _ in range(num_resamples):
    values = statistic(_replicate(layout, sizes, rng))
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


def p_value(samples_Z) -> float:
  """Two-sided Monte Carlo p-value of "the effect is 0" from Z finite replicates:
  2 (k + 1) / (Z + 1), at most 1, where k is the smaller count of replicates on either
  side of 0 (a replicate at 0 counts on both). The + 1s (Davison and Hinkley 1997,
  section 4.2) keep it valid at any Z: it is never 0, and no fewer than
  `resamples_to_decide` replicates can take it below a threshold, so a family of many
  tests cannot be decided on too few replicates. NaN with no finite replicate."""
  finite = np.asarray(samples_Z, np.float64)
  finite = finite[np.isfinite(finite)]
  if finite.size == 0:
    return float("nan")
  k = min(int(np.sum(finite <= 0)), int(np.sum(finite >= 0)))
  return min(1.0, 2.0 * (k + 1) / (finite.size + 1))


def effect_p_value(e: Mapping[str, Any]) -> float:
  """`p_value` of an effect's replicates; NaN when its interval is undefined (`effect`:
  fewer than `MIN_DEFINED` of them have a value), so that no verdict rests on the few
  replicates where the statistic happened to exist."""
  lo, hi = e.get("lo"), e.get("hi")
  if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
    return float("nan")
  return p_value(e.get("samples", []))


def resamples_to_decide(family: int, alpha: float = 1.0 - DEFAULT_LEVEL) -> int:
  """The fewest replicates whose smallest p-value (2 / (Z + 1), no replicate across 0)
  passes Holm's strictest threshold alpha / family: below it, no test of the family can
  be decided however large its effect."""
  z = max(1, math.floor(2.0 * family / alpha) - 1)
  while 2.0 * family / (z + 1) >= alpha:   # exact at the boundary, whatever the rounding
    z += 1
  return z


def holm(p_values: Sequence[float]) -> list[float]:
  """Holm's step-down adjusted p-values: the family-wise error rate is at most alpha
  when each test decides at adjusted p < alpha. A NaN p-value counts in the family
  (as a test that rejects nothing) and stays NaN."""
  p = np.asarray(p_values, np.float64)
  m = p.size
  filled = np.where(np.isfinite(p), p, 1.0)
  order = np.argsort(filled, kind="stable")
  adjusted = np.empty(m)
  running = 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (m - rank) * filled[i]))
    adjusted[i] = running
  return [float(a) if np.isfinite(x) else float("nan") for a, x in zip(adjusted, p)]


def p_verdict(value: float, p: float, *, alpha: float = 1.0 - DEFAULT_LEVEL,
              expected: int = 1) -> str:
  """yes when p < alpha and the estimate lies on the expected side of 0, no when
  p < alpha on the other side, inconclusive otherwise (or when p is NaN)."""
  if not (np.isfinite(p) and np.isfinite(value)) or p >= alpha or value == 0:
    return INCONCLUSIVE
  return YES if value * expected > 0 else NO


def sign_verdict(e: Mapping[str, Any], *, expected: int = 1) -> str:
  """yes when the interval lies strictly on the expected side of 0, no when it lies
  strictly on the other side, inconclusive when it touches or straddles 0 (a
  two-sided test of "no effect": an interval [x, 0] has not excluded 0)."""
  lo, hi = e["lo"], e["hi"]
  if not (np.isfinite(lo) and np.isfinite(hi)):
    return INCONCLUSIVE
  if expected < 0:
    lo, hi = -hi, -lo
  if lo > 0:
    return YES
  if hi < 0:
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
