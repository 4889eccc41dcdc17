"""The compute-optimal frontier over fitted curves, and the n*(C) law.

Given one fitted sigmoid per allocation (B_p, n), the frontier at compute C is
the allocation whose fitted curve is highest there (the IsoCompute paper's workflow);
n*(C) is its n. The paper finds log2 n*(C) rising with log C and then saturating,
which is the ScaleRL sigmoid again with log2 n in place of the metric:

    log2 n*(C) = L_low + (L_high - L_low) / (1 + (C_mid / C)^B)

so `fit_n_star_law` reuses `sigmoid_fit.fit_sigmoid`, and 2^L_high is where n
saturates. The same functions give n*(M) at a fixed batch B (compute axis M =
C / B) and the frontier at a fixed B_p.

A fitted curve takes part in the envelope from C = 0 (it is anchored at R0)
up to a `max_compute` limit set by the caller near the end of its own data (the
analysis uses the last evaluation plus one batch): never extrapolated far forwards
unless asked.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import numpy as np

from isojax.planner import sigmoid_fit

Key = tuple[int, int]  # (problems_per_batch, rollouts_per_problem)
LAW_FORM = "log2 n*({x}) = log2_n_low + (log2_n_high - log2_n_low) / (1 + (c_mid / {x})^b)"
_UNIT_SYMBOL = {"rollouts": "C", "tokens": "C", "num_steps": "M"}
SATURATION_FRACTION = 0.9  # n has "saturated" once 90% of its log2 rise is done


@dataclasses.dataclass(frozen=True)
class FrontierPoint:
  """The best allocation at one compute value."""
  rollouts: float
  value: float
  problems_per_batch: int
  rollouts_per_problem: int

  def to_dict(self, metric: str | None = None) -> dict[str, Any]:
    d = {"rollouts": self.rollouts, "value": self.value,
         "problems_per_batch": self.problems_per_batch,
         "rollouts_per_problem": self.rollouts_per_problem,
         "batch_rollouts": self.problems_per_batch * self.rollouts_per_problem}
    if metric:
      d[metric] = self.value
    return d


def compute_grid(lo: float, hi: float, num: int = 64) -> np.ndarray:
  """[num] log-spaced compute values from lo to hi (both > 0)."""
  if not 0 < lo <= hi:
    raise ValueError(f"compute range [{lo}, {hi}]: expected 0 < lo <= hi")
  return np.geomspace(lo, hi, num)


def upper_envelope(fits: Sequence[sigmoid_fit.SigmoidFit], compute_E,
                   max_compute_A=None) -> tuple[np.ndarray, np.ndarray]:
  """(best_E, value_E): index of the highest fitted curve at each C, and its value.

  Curve k is eligible at C <= max_compute_A[k] (all C when None). Ties go to the
  lowest index, so a sorted list of fits gives a deterministic frontier. best_E is
  -1 (value -inf) where no curve is eligible.
  """
  c_E = np.asarray(compute_E, np.float64)
  if not fits:
    return np.full(c_E.shape, -1), np.full(c_E.shape, -np.inf)
  pred_AE = np.stack([f.predict(c_E) for f in fits])
  if max_compute_A is not None:
    limit_A = np.asarray(max_compute_A, np.float64) * (1 + 1e-9)
    pred_AE = np.where(c_E[None, :] <= limit_A[:, None], pred_AE, -np.inf)
  best_E = np.argmax(pred_AE, axis=0)
  value_E = pred_AE[best_E, np.arange(c_E.size)]
  return np.where(np.isfinite(value_E), best_E, -1), value_E


def fitted_frontier(keys: Sequence[Key], fits: Sequence[sigmoid_fit.SigmoidFit],
                    compute_E, max_compute_A=None) -> list[FrontierPoint]:
  """The frontier on `compute_E`, sorted by compute; points with no curve dropped."""
  if len(keys) != len(fits):
    raise ValueError(f"{len(keys)} keys for {len(fits)} fits")
  best_E, value_E = upper_envelope(fits, compute_E, max_compute_A)
  return [FrontierPoint(float(c), float(v), *keys[k])
          for c, k, v in zip(np.asarray(compute_E, np.float64), best_E, value_E) if k >= 0]


def empirical_frontier(points: Sequence[tuple[float, float, Key]]) -> list[FrontierPoint]:
  """The observed upper envelope: points (C, value, key) that beat every point at
  lower or equal compute, sorted by compute. Ties at one C go to the higher value,
  then the smaller key."""
  ordered = sorted(points, key=lambda p: (p[0], -p[1], p[2]))
  out, best = [], -math.inf
  for c, v, key in ordered:
    if v > best:
      out.append(FrontierPoint(float(c), float(v), *key))
      best = v
  return out


@dataclasses.dataclass(frozen=True)
class NStarLaw:
  """log2 n*(C) as a sigmoid of log C (C in `unit`)."""
  log2_n_low: float
  log2_n_high: float
  b: float
  c_mid: float
  compute_range: tuple[float, float]  # the compute the law was fitted on (or documented for)
  unit: str = "rollouts"
  source: str = "fit"
  rmse: float = 0.0
  num_points: int = 0

  def log2_n_star(self, compute) -> np.ndarray:
    return sigmoid_fit.sigmoid(compute, self.log2_n_low, self.log2_n_high, self.b, self.c_mid)

  def n_star(self, compute) -> np.ndarray:
    """The continuous n*(C); prescriptions round it to a power of two."""
    return np.exp2(self.log2_n_star(compute))

  def saturation_compute(self, fraction: float = SATURATION_FRACTION) -> float:
    """The C by which log2 n* has covered `fraction` of its rise."""
    if self.log2_n_high <= self.log2_n_low:
      return self.compute_range[0]  # flat: saturated from the start
    return self.c_mid * (fraction / (1 - fraction)) ** (1 / self.b)

  def to_dict(self) -> dict[str, Any]:
    saturation = self.saturation_compute()
    return {
        "form": LAW_FORM.format(x=_UNIT_SYMBOL.get(self.unit, self.unit)),
        "unit": self.unit, "source": self.source,
        "log2_n_low": self.log2_n_low, "log2_n_high": self.log2_n_high,
        "b": self.b, "c_mid": self.c_mid,
        "n_low": 2.0 ** self.log2_n_low, "n_saturation": 2.0 ** self.log2_n_high,
        "saturation_compute": saturation,
        "saturation_fraction": SATURATION_FRACTION,
        "saturated_within_range": bool(saturation <= self.compute_range[1]),
        "compute_range": list(self.compute_range),
        "rmse": self.rmse, "num_points": self.num_points,
    }

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "NStarLaw":
    try:
      return cls(log2_n_low=float(d["log2_n_low"]), log2_n_high=float(d["log2_n_high"]),
                 b=float(d["b"]), c_mid=float(d["c_mid"]),
                 compute_range=tuple(float(x) for x in d["compute_range"]),
                 unit=d.get("unit", "rollouts"), source=d.get("source", "fit"),
                 rmse=float(d.get("rmse", 0.0)), num_points=int(d.get("num_points", 0)))
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(f"not an n*(C) law ({e!r}); expected the keys of NStarLaw.to_dict") from e


def fit_n_star_law(compute_E, n_E, *, unit: str = "rollouts",
                   n_bounds: tuple[float, float] | None = None) -> NStarLaw:
  """Fits log2 n* against compute; `n_E` are the frontier's n at `compute_E`.

  The compute grid should be log-spaced (as `compute_grid` is) so each decade of
  compute weighs the same. `n_bounds` bounds n_low and n_saturation (default:
  the smallest and largest n seen).
  """
  c_E = np.asarray(compute_E, np.float64)
  log_n_E = np.log2(np.asarray(n_E, np.float64))
  lo, hi = (math.log2(x) for x in n_bounds) if n_bounds else (log_n_E.min(), log_n_E.max())
  fit = sigmoid_fit.fit_sigmoid(c_E, log_n_E, lower=lo, upper=max(hi, lo))
  return NStarLaw(log2_n_low=fit.r0, log2_n_high=fit.a, b=fit.b, c_mid=fit.c_mid,
                  compute_range=(float(c_E.min()), float(c_E.max())), unit=unit,
                  rmse=fit.rmse, num_points=fit.num_points)


def law_from_frontier(points: Sequence[FrontierPoint],
                      fits: Sequence[sigmoid_fit.SigmoidFit], *, unit: str = "rollouts",
                      compute_scale: float = 1.0,
                      n_bounds: tuple[float, float] | None = None) -> NStarLaw | None:
  """The n* law of a frontier (compute divided by compute_scale) of `fits`, or None when
  the frontier has fewer than `sigmoid_fit.MIN_POINTS` points or no fit rises: flat fits
  tie at every C, and a frontier of ties is the tie-break's allocation (the smallest
  key), not an n* (as claim 1's `n_star.frontier_stats` reads it)."""
  if len(points) < sigmoid_fit.MIN_POINTS or all(f.flat for f in fits):
    return None
  c_E = np.array([p.rollouts for p in points]) / compute_scale
  n_E = np.array([p.rollouts_per_problem for p in points])
  return fit_n_star_law(c_E, n_E, unit=unit, n_bounds=n_bounds)


def group_frontiers(keys: Sequence[Key], fits: Sequence[sigmoid_fit.SigmoidFit],
                    max_compute_A: Sequence[float], *, by: str,
                    num: int = 64) -> dict[int, dict[str, Any]]:
  """Frontiers within groups of allocations that share B_p (by='problems_per_batch')
  or B = B_p * n (by='batch_rollouts'), for groups with at least two n.

  Returns {group value: {'frontier': [FrontierPoint], 'law': NStarLaw | None,
  'unit': ...}}. At fixed B the compute axis of the law is M = C / B
  (unit 'num_steps'): n*(M), and B_p*(M) = B / n*(M).
  """
  if by not in ("problems_per_batch", "batch_rollouts"):
    raise ValueError(f"by={by!r}: expected 'problems_per_batch' or 'batch_rollouts'")
  groups: dict[int, list[int]] = {}
  for k, (b_p, n) in enumerate(keys):
    groups.setdefault(b_p if by == "problems_per_batch" else b_p * n, []).append(k)
  out = {}
  for value in sorted(groups):
    members = groups[value]
    if len({keys[k][1] for k in members}) < 2:
      continue
    member_fits = [fits[k] for k in members]
    lo = min(f.compute_range[0] for f in member_fits)
    hi = max(f.compute_range[1] for f in member_fits)
    grid_E = compute_grid(lo, hi, num)
    points = fitted_frontier([keys[k] for k in members], member_fits, grid_E,
                             [max_compute_A[k] for k in members])
    fixed_batch = by == "batch_rollouts"
    law = law_from_frontier(points, member_fits,
                            unit="num_steps" if fixed_batch else "rollouts",
                            compute_scale=value if fixed_batch else 1.0)
    out[value] = {"frontier": points, "law": law}
  return out
