"""Allocation grids: the ways to split a sampling budget C = B_p * n * M.

The IsoCompute paper sweeps powers of two: B_p problems per batch and n
rollouts per problem with B = B_p * n <= B_max, and M update iterations. The
grids here are the sweeps it runs:

  batch_grid          every (B_p, n) with B_p * n <= B_max
  iso_compute_grid    every (B_p, n, M) with B_p * n * M = C       (the main sweep)
  fixed_batch_grid    B_p * n = B fixed, M varies                   (hardware-bound B)
  fixed_problems_grid B_p fixed, n and M vary with B_p * n * M = C

Compute is counted in rollouts; `tokens` and `accelerator_hours` convert it to
the second unit and to a cost from a measured throughput.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence


class BudgetTooSmallError(ValueError):
  """No allocation fits the budget within the given ranges."""


@dataclasses.dataclass(frozen=True, order=True)
class Allocation:
  """One way to spend a budget: B_p problems x n rollouts, M times."""
  problems_per_batch: int   # B_p
  rollouts_per_problem: int  # n
  num_steps: int            # M

  @property
  def batch_rollouts(self) -> int:
    """B = B_p * n, rollouts per update iteration."""
    return self.problems_per_batch * self.rollouts_per_problem

  @property
  def rollouts(self) -> int:
    """C = B_p * n * M, the compute this allocation spends."""
    return self.batch_rollouts * self.num_steps

  def to_dict(self) -> dict[str, int]:
    return {"problems_per_batch": self.problems_per_batch,
            "rollouts_per_problem": self.rollouts_per_problem,
            "num_steps": self.num_steps, "budget_rollouts": self.rollouts}


def powers_of_two(lo: int, hi: int) -> list[int]:
  """Powers of two p with lo <= p <= hi, ascending (1 counts as 2^0)."""
  if lo < 1 or hi < 1:
    raise ValueError(f"range [{lo}, {hi}]: bounds must be >= 1")
  out, p = [], 1
  while p <= hi:
    if p >= lo:
      out.append(p)
    p *= 2
  return out


def _check_range(name: str, value_range: Sequence[int]) -> tuple[int, int]:
  lo, hi = (int(v) for v in value_range)
  if not 1 <= lo <= hi:
    raise ValueError(f"{name}={tuple(value_range)}: expected 1 <= low <= high")
  return lo, hi


def batch_grid(max_batch_rollouts: int, problems_range: Sequence[int],
               rollouts_range: Sequence[int]) -> list[tuple[int, int]]:
  """Every power-of-two (B_p, n) in the ranges with B_p * n <= B_max, sorted."""
  bp_lo, bp_hi = _check_range("problems_range", problems_range)
  n_lo, n_hi = _check_range("rollouts_range", rollouts_range)
  return [(b_p, n)
          for b_p in powers_of_two(bp_lo, bp_hi)
          for n in powers_of_two(n_lo, n_hi)
          if b_p * n <= max_batch_rollouts]


def iso_compute_grid(budget_rollouts: int, max_batch_rollouts: int,
                     problems_range: Sequence[int], rollouts_range: Sequence[int], *,
                     min_steps: int = 1, exact: bool = True) -> list[Allocation]:
  """Every power-of-two allocation spending the budget C, sorted by (B_p, n).

  With exact=True, B_p * n * M == C (B must divide C); otherwise M = C // B and
  the allocation spends B * M <= C, the remainder of less than one batch unused.
  Raises BudgetTooSmallError when no allocation has M >= min_steps.
  """
  if budget_rollouts < 1 or min_steps < 1:
    raise ValueError(f"budget_rollouts={budget_rollouts} and min_steps={min_steps} must be >= 1")
  grid = []
  for b_p, n in batch_grid(max_batch_rollouts, problems_range, rollouts_range):
    steps, remainder = divmod(budget_rollouts, b_p * n)
    if steps >= min_steps and (remainder == 0 or not exact):
      grid.append(Allocation(b_p, n, steps))
  if not grid:
    raise BudgetTooSmallError(_too_small_message(
        budget_rollouts, max_batch_rollouts, problems_range, rollouts_range, min_steps,
        exact))
  return grid


def _too_small_message(budget, b_max, problems_range, rollouts_range, min_steps, exact):
  problems = powers_of_two(*_check_range("problems_range", problems_range))
  rollouts = powers_of_two(*_check_range("rollouts_range", rollouts_range))
  if not problems or not rollouts:
    return (f"no power of two in problems_range={tuple(problems_range)} or "
            f"rollouts_range={tuple(rollouts_range)}")
  b_p, n = problems[0], rollouts[0]
  if b_p * n > b_max:
    return (f"no allocation fits: the smallest batch B_p * n = {b_p} * {n} = {b_p * n} "
            f"exceeds max_batch_rollouts={b_max}")
  if budget < b_p * n * min_steps:
    return (f"budget_rollouts={budget} is too small for any allocation: the smallest "
            f"batch B_p * n = {b_p} * {n} = {b_p * n} times min_steps={min_steps} needs "
            f"{b_p * n * min_steps} rollouts")
  return (f"budget_rollouts={budget} is not a multiple of any power-of-two batch "
          f"B_p * n <= {b_max} with at least min_steps={min_steps} steps; use a multiple "
          f"of a power of two, or exact=False to floor M")


def fixed_batch_grid(batch_rollouts: int, num_steps: Iterable[int],
                     problems_range: Sequence[int],
                     rollouts_range: Sequence[int]) -> list[Allocation]:
  """B_p * n = B fixed by hardware, one allocation per (B_p, n, M), sorted.

  The (B_p, n) pairs are the power-of-two factorisations of B in the ranges; M
  runs over `num_steps` (positive, duplicates dropped).
  """
  steps = sorted(set(int(m) for m in num_steps))
  if not steps or steps[0] < 1:
    raise ValueError(f"num_steps={steps}: expected a non-empty set of positive integers")
  pairs = [(b_p, n) for b_p, n in batch_grid(batch_rollouts, problems_range, rollouts_range)
           if b_p * n == batch_rollouts]
  if not pairs:
    raise BudgetTooSmallError(
        f"batch_rollouts={batch_rollouts} is not B_p * n for powers of two B_p in "
        f"{tuple(problems_range)} and n in {tuple(rollouts_range)}")
  return [Allocation(b_p, n, m) for b_p, n in pairs for m in steps]


def fixed_problems_grid(problems_per_batch: int, budget_rollouts: int,
                        max_batch_rollouts: int, rollouts_range: Sequence[int], *,
                        min_steps: int = 1, exact: bool = True) -> list[Allocation]:
  """B_p fixed; every power-of-two n spending the budget C, sorted by n."""
  if not _is_power_of_two(problems_per_batch):
    raise ValueError(f"problems_per_batch={problems_per_batch}: expected a power of two")
  return iso_compute_grid(budget_rollouts, max_batch_rollouts,
                          (problems_per_batch, problems_per_batch), rollouts_range,
                          min_steps=min_steps, exact=exact)


def _is_power_of_two(x: int) -> bool:
  return x >= 1 and x & (x - 1) == 0


# --- Compute units -------------------------------------------------------------


def tokens(rollouts: float, tokens_per_rollout: float) -> float:
  """Compute in generated tokens: rollouts times the mean response length."""
  if tokens_per_rollout <= 0:
    raise ValueError(f"tokens_per_rollout={tokens_per_rollout}: expected > 0")
  return rollouts * tokens_per_rollout


def accelerator_hours(rollouts: float, tokens_per_rollout: float,
                      tokens_per_accelerator_second: float) -> float:
  """Accelerator-hours to sample `rollouts` at a measured generation throughput.

  `tokens_per_accelerator_second` is the sustained throughput of one accelerator
  (generated tokens per second, sampling and training together), e.g. `tokens`
  divided by `wall_s` times the number of accelerators of a past run.
  """
  if tokens_per_accelerator_second <= 0:
    raise ValueError(
        f"tokens_per_accelerator_second={tokens_per_accelerator_second}: expected > 0")
  return tokens(rollouts, tokens_per_rollout) / tokens_per_accelerator_second / 3600.0


def rollouts_for_hours(hours: float, tokens_per_rollout: float,
                       tokens_per_accelerator_second: float) -> int:
  """The budget C (whole rollouts) that `hours` accelerator-hours buy."""
  if hours < 0:
    raise ValueError(f"hours={hours}: expected >= 0")
  accelerator_hours(0.0, tokens_per_rollout, tokens_per_accelerator_second)  # validates
  exact = hours * 3600.0 * tokens_per_accelerator_second / tokens_per_rollout
  return int(math.floor(exact * (1 + 1e-12)))  # 1e-12: 2.9999999 rollouts is 3
