"""The paper's difficulty classes and splits, chosen from measured pass rates (pure).

The IsoCompute paper defines difficulty by the *base* model's avg@16, the mean 0/1
reward over 16 samples, and fills each split from pass-rate bands:

  easy                    avg@16 in [0.3, 0.6]
  hard                    avg@16 in [0, 0.0625]
  extremely_hard          avg@16 = 0 and 0 correct of 128 further samples (pass@128 = 0)
  very_easy               avg@16 in [0.6, 0.9]
  mix_hard_easy           50% hard, 50% easy
  mix_hard_easy_veryeasy  50% hard, 25% easy, 25% very easy

This module only selects: given per-problem correct counts (`ProblemRates`), which
problems go into which split. Measuring the counts with the base model is
`isojax.sweeps.profiling`; `launch.profile` is the command line.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from isojax.tasks.problem import Problem

_TOL = 1e-9  # band edges are inclusive


@dataclasses.dataclass(frozen=True)
class Band:
  """A closed interval of avg@k pass rates."""
  low: float
  high: float

  def contains(self, rate: float) -> bool:
    return self.low - _TOL <= rate <= self.high + _TOL


# The IsoCompute paper's difficulty classes. `extremely_hard` is avg@k = 0 *and* no
# correct sample of `hard_samples` more, so it is not a band.
BANDS: dict[str, Band] = {
    "hard": Band(0.0, 0.0625),
    "easy": Band(0.3, 0.6),
    "very_easy": Band(0.6, 0.9),
}
EXTREMELY_HARD = "extremely_hard"
# Each split: the fraction of its problems drawn from each difficulty class.
SPLITS: dict[str, dict[str, float]] = {
    "easy": {"easy": 1.0},
    "hard": {"hard": 1.0},
    EXTREMELY_HARD: {EXTREMELY_HARD: 1.0},
    "very_easy": {"very_easy": 1.0},
    "mix_hard_easy": {"hard": 0.5, "easy": 0.5},
    "mix_hard_easy_veryeasy": {"hard": 0.5, "easy": 0.25, "very_easy": 0.25},
}


@dataclasses.dataclass
class ProblemRates:
  """Measured pass rates of a pool of problems."""
  problems: list[Problem]
  correct_G: np.ndarray             # [G] int, correct of num_samples
  hard_correct_G: np.ndarray        # [G] int, correct of hard_samples; -1 = not sampled
  num_samples: int
  lengths_GN: np.ndarray | None = None    # [G, num_samples] int, generated tokens
  truncated_GN: np.ndarray | None = None  # [G, num_samples] bool, cut at the token cap

  @property
  def rate_G(self) -> np.ndarray:   # [G] float, avg@num_samples
    return self.correct_G / self.num_samples

  def members(self, name: str) -> list[int]:
    """Indices (in pool order) of the problems of one difficulty class."""
    if name == EXTREMELY_HARD:
      return [i for i in range(len(self.problems))
              if self.correct_G[i] == 0 and self.hard_correct_G[i] == 0]
    band = BANDS[name]
    return [i for i, r in enumerate(self.rate_G) if band.contains(float(r))]


def select(rates: ProblemRates, composition: dict[str, float], size: int
           ) -> tuple[list[int], dict[str, int]]:
  """Indices for a split of `size` problems in the composition's proportions.

  Draws each class's share in pool order (the pool is already random). When a class
  has too few problems the whole split shrinks so the proportions hold. Returns the
  indices and the available count per class.
  """
  available = {c: rates.members(c) for c in composition}
  total = size
  for c, fraction in composition.items():
    total = min(total, int(len(available[c]) / fraction + _TOL))
  counts = _shares(composition, total)
  chosen, seen = [], set()
  for c, count in counts.items():
    taken = 0
    for i in available[c]:
      if taken == count:
        break
      if rates.problems[i].prompt not in seen:  # classes may share an edge value
        seen.add(rates.problems[i].prompt)
        chosen.append(i)
        taken += 1
  return chosen, {c: len(v) for c, v in available.items()}


def _shares(composition: dict[str, float], total: int) -> dict[str, int]:
  """Integer counts summing to `total`, in the composition's proportions."""
  counts = {c: int(total * f) for c, f in composition.items()}
  first = next(iter(composition))
  counts[first] += total - sum(counts.values())  # rounding goes to the first class
  return counts


@dataclasses.dataclass
class SplitPlan:
  """The problems (pool indices) chosen for one split."""
  name: str
  train: list[int]
  val: list[int]
  available_train: dict[str, int]   # problems per difficulty class in the pool
  available_val: dict[str, int]


def plan_splits(train_rates: ProblemRates, val_rates: ProblemRates, names: Sequence[str],
                num_train: int, num_val: int) -> tuple[list[SplitPlan], list[str]]:
  """The non-empty splits of `names`, and a description of each empty one."""
  plans, empty = [], []
  for name in names:
    composition = SPLITS[name]
    train_idx, train_avail = select(train_rates, composition, num_train)
    val_idx, val_avail = select(val_rates, composition, num_val)
    if not train_idx or not val_idx:
      empty.append(f"{name} (train: {len(train_idx)} of {num_train}, val: "
                   f"{len(val_idx)} of {num_val}; available per class: train "
                   f"{train_avail}, val {val_avail})")
    else:
      plans.append(SplitPlan(name, train_idx, val_idx, train_avail, val_avail))
  return plans, empty
