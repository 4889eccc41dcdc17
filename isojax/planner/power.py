"""How many seeds a sweep needs to decide a slope claim: the power calculation behind a
study's size.

Claims 2a and 2b are decided on the least-squares slope of the runs' final values on
log2 n (`experiments.final_slope_log2_n`) over every run of the sweep, each allocation
run on k seeds. With a run-to-run standard deviation sd of a final value (seeds and
evaluation noise together, measured on a pilot), the slope's standard error is

    se = sd / sqrt(k * sum_a (x_a - mean x)^2),   x_a = log2 n of allocation a,

and a true slope `effect` is decided (its two-sided interval excludes 0 at the level
Holm's first step asks of a family of m claims, alpha / m) with probability

    power = Phi(|effect| / se - z) + Phi(-|effect| / se - z),   z = Phi^-1(1 - alpha / 2m).

`seeds_for_slope` is the fewest k whose power reaches the target, and `detectable_slope`
the smallest effect k seeds decide with that power. The normal
approximation stands in for the study's seed bootstrap; the tests check it against a
simulation of the slope's test.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import optimize, stats


def slope_se(sd: float, log2_ns: Sequence[float], seeds: int) -> float:
  """The least-squares slope's standard error with `seeds` runs at each log2 n."""
  x = np.asarray(log2_ns, np.float64)
  spread = float(((x - x.mean()) ** 2).sum())
  if spread <= 0 or seeds < 1 or not sd > 0:
    raise ValueError(f"log2_ns={list(log2_ns)}, seeds={seeds}, sd={sd}: expected two or more "
                     "distinct n, at least one seed and a positive sd")
  return sd / math.sqrt(seeds * spread)


def slope_power(sd: float, effect: float, log2_ns: Sequence[float], seeds: int, *,
                alpha: float = 0.10, family: int = 3) -> float:
  """The probability that a true slope `effect` is decided at Holm's first step."""
  z = stats.norm.ppf(1 - alpha / (2 * family))
  shift = abs(effect) / slope_se(sd, log2_ns, seeds)
  return float(stats.norm.cdf(shift - z) + stats.norm.cdf(-shift - z))


def seeds_for_slope(sd: float, effect: float, log2_ns: Sequence[float], *,
                    alpha: float = 0.10, family: int = 3, power: float = 0.8,
                    max_seeds: int = 1000) -> int | None:
  """The fewest seeds per allocation that decide `effect` with `power` (None: more than
  `max_seeds`)."""
  for k in range(1, max_seeds + 1):
    if slope_power(sd, effect, log2_ns, k, alpha=alpha, family=family) >= power:
      return k
  return None


def detectable_slope(sd: float, log2_ns: Sequence[float], seeds: int, *,
                     alpha: float = 0.10, family: int = 3, power: float = 0.8) -> float:
  """The smallest slope per doubling of n that `seeds` runs at each log2 n decide with
  probability `power` (the root of `slope_power`, which rises with |effect|)."""
  se = slope_se(sd, log2_ns, seeds)
  return float(optimize.brentq(
      lambda effect: slope_power(sd, effect, log2_ns, seeds, alpha=alpha,
                                 family=family) - power, 0.0, 100 * se, xtol=1e-12 * se))
