"""No-Positive-Resampling (ScaleRL): problems the policy already solves leave the pool.

A problem whose rollouts are (nearly) all correct gives zero-variance groups and so no
GRPO signal; sampling it again wastes rollouts. `ProblemPool` keeps each training
problem's historical pass counts and permanently retires a problem once its
historical pass rate reaches `threshold` (0.9 in ScaleRL and the IsoCompute paper).
Retirement is permanent: a retired problem is never sampled again, even if later
updates (from batches sampled before it retired) would lower its rate.

The pass rate is the mean reward over all recorded rollouts of the problem (successes
accumulate rewards in [0, 1]; with 0/1 rewards this is the fraction correct). The pool
is host-side NumPy state, not part of the jitted step, and round-trips through a dict
of NumPy arrays for checkpointing (`to_dict` / `from_dict`).

A pool of threshold 0 retires nothing: it is only the per-problem pass history that
per-problem rollout allocation (`rl.allocation='per_problem'`) estimates pass rates from.

If fewer active problems remain than a batch needs, `sample` warns and fills the batch
from the whole active pool: every active problem once, the remaining slots drawn with
replacement, so the batch keeps its static size B_p (no recompilation). An empty
active pool is an error.
"""

from __future__ import annotations

import warnings

import numpy as np

_KEYS = ("successes", "attempts", "retired", "threshold", "min_attempts")


class ProblemPool:
  """Per-problem pass counts over training, and the pool of problems still sampled.

  Attributes:
    successes_G: float64 [G], summed rewards of all recorded rollouts.
    attempts_G:  int64 [G], number of recorded rollouts.
    retired_G:   bool [G], permanently out of the sampling pool.
  """

  def __init__(self, num_problems: int, *, threshold: float = 0.9, min_attempts: int = 1):
    if isinstance(num_problems, bool) or not isinstance(num_problems, (int, np.integer)) \
        or num_problems < 1:
      raise ValueError(f"num_problems={num_problems!r}: expected a positive int")
    if not 0 <= threshold <= 1:
      raise ValueError(f"threshold={threshold!r}: expected a pass rate in (0, 1], or 0 (a "
                       "history that retires nothing)")
    if min_attempts < 1:
      raise ValueError(f"min_attempts={min_attempts!r}: expected >= 1")
    self.threshold = float(threshold)
    self.min_attempts = int(min_attempts)
    self.successes_G = np.zeros(num_problems, np.float64)
    self.attempts_G = np.zeros(num_problems, np.int64)
    self.retired_G = np.zeros(num_problems, bool)

  @property
  def num_problems(self) -> int:
    return len(self.attempts_G)

  def update(self, problem_ids, rewards) -> None:
    """Records rollouts: problem_ids [B] int (repeats allowed), rewards [B] in [0, 1].

    Then retires every problem with at least `min_attempts` rollouts whose
    historical pass rate is >= threshold.
    """
    ids_B = np.asarray(problem_ids).reshape(-1)
    rewards_B = np.asarray(rewards, np.float64).reshape(-1)
    if ids_B.shape != rewards_B.shape:
      raise ValueError(f"problem_ids has {ids_B.size} entries but rewards has "
                       f"{rewards_B.size}: expected one reward per rollout")
    if ids_B.size and not np.issubdtype(ids_B.dtype, np.integer):
      raise ValueError(f"problem_ids has dtype {ids_B.dtype}: expected integers")
    if ids_B.size and (ids_B.min() < 0 or ids_B.max() >= self.num_problems):
      raise ValueError(f"problem_ids must lie in [0, {self.num_problems}), got range "
                       f"[{ids_B.min()}, {ids_B.max()}]")
    if np.any(~np.isfinite(rewards_B)) or np.any((rewards_B < 0) | (rewards_B > 1)):
      raise ValueError("rewards must lie in [0, 1] (a pass rate is their mean)")
    np.add.at(self.successes_G, ids_B, rewards_B)
    np.add.at(self.attempts_G, ids_B, 1)
    if self.retires:
      newly_solved_G = (self.attempts_G >= self.min_attempts) & (
          self.pass_rates() >= self.threshold)
      self.retired_G |= newly_solved_G

  @property
  def retires(self) -> bool:
    """Whether the pool retires problems (No-Positive-Resampling) or only records them."""
    return self.threshold > 0

  def pass_rates(self) -> np.ndarray:
    """Historical pass rate [G] float64; 0 for problems never attempted."""
    return self.successes_G / np.maximum(self.attempts_G, 1)

  def active_ids(self) -> np.ndarray:
    """int64 ids of the problems still in the sampling pool, ascending."""
    return np.flatnonzero(~self.retired_G)

  def sample(self, rng: np.random.Generator, problems_per_batch: int) -> np.ndarray:
    """int64 [problems_per_batch] distinct active problem ids, uniformly at random.

    With fewer active problems than requested, warns and returns each active problem
    once plus the rest drawn with replacement from the active pool, shuffled.
    """
    if problems_per_batch < 1:
      raise ValueError(f"problems_per_batch={problems_per_batch!r}: expected a positive int")
    active = self.active_ids()
    if active.size == 0:
      raise ValueError(
          f"No-Positive-Resampling retired all {self.num_problems} problems (historical "
          f"pass rate >= threshold={self.threshold}); nothing left to sample")
    if active.size >= problems_per_batch:
      return rng.choice(active, size=problems_per_batch, replace=False)
    warnings.warn(
        f"only {active.size} active problems for a batch of {problems_per_batch}: every active "
        "problem is sampled, the remaining slots with replacement", stacklevel=2)
    extra = rng.choice(active, size=problems_per_batch - active.size, replace=True)
    return rng.permutation(np.concatenate([active, extra]))

  def to_dict(self) -> dict[str, np.ndarray]:
    """The state as a flat dict of NumPy arrays (for a checkpoint)."""
    return {
        "successes": self.successes_G.copy(),
        "attempts": self.attempts_G.copy(),
        "retired": self.retired_G.copy(),
        "threshold": np.asarray(self.threshold, np.float64),
        "min_attempts": np.asarray(self.min_attempts, np.int64),
    }

  @classmethod
  def from_dict(cls, state: dict[str, np.ndarray]) -> "ProblemPool":
    """Inverse of `to_dict`."""
    missing = [k for k in _KEYS if k not in state]
    if missing:
      raise ValueError(f"problem pool state lacks {missing}: expected keys {list(_KEYS)}")
    attempts = np.asarray(state["attempts"], np.int64)
    successes = np.asarray(state["successes"], np.float64)
    retired = np.asarray(state["retired"], bool)
    if attempts.ndim != 1 or successes.shape != attempts.shape or retired.shape != attempts.shape:
      raise ValueError(
          f"problem pool state: successes {successes.shape}, attempts {attempts.shape} and "
          f"retired {retired.shape} must be equal 1-D shapes")
    pool = cls(len(attempts), threshold=float(state["threshold"]),
               min_attempts=int(state["min_attempts"]))
    pool.successes_G = successes.copy()
    pool.attempts_G = attempts.copy()
    pool.retired_G = retired.copy()
    return pool
