"""Rollouts allocated per problem: each problem's n_i from its estimated pass rate.

A group whose rollouts all succeed or all fail gives GRPO no gradient. With a pass rate
p, a group of n has both outcomes with probability

    q(p, n) = 1 - p^n - (1 - p)^n,

the learning value Knapsack RL (arXiv 2509.25849) gives a problem. Under a step's budget
of B_p * n rollouts, `allocate` splits it among the step's problems to maximise the sum
of q(p_i, n_i), subject to n_min <= n_i <= n_max. The objective is separable and each q
is concave in n (its increments p^n (1 - p) + (1 - p)^n p shrink as n grows), so adding
rollouts one at a time where the increment is largest is exactly optimal (the greedy
algorithm for separable concave resource allocation); the tests check it against brute
force. A problem at p = 0 or 1 has q = 0 for every n and gets n_min.

The pass rate is estimated by `pass_rate_estimate`: the posterior mean of a Beta prior
(mean `rl.allocation_prior_mean`, strength `rl.allocation_prior_strength` pseudo-
rollouts) updated with every rollout of the problem seen so far: the base model's
samples of it in the difficulty profile (c correct of k, where the run's problems come
from a profiled split; `Profile`), then the run's own rollouts.

Pure NumPy: the sampler and the planner call it with plain arrays.
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import Mapping, Sequence

import numpy as np


def mixed_group_probability(p, n) -> np.ndarray:
  """q(p, n) = 1 - p^n - (1 - p)^n: a group of n has both outcomes (broadcasts)."""
  p, n = np.asarray(p, np.float64), np.asarray(n, np.float64)
  return 1.0 - p ** n - (1.0 - p) ** n


def pass_rate_estimate(successes_G, trials_G, prior_mean_G, prior_strength: float
                       ) -> np.ndarray:
  """[G] posterior means of each problem's pass rate: a Beta prior of mean
  `prior_mean_G` (in (0, 1)) and `prior_strength` pseudo-rollouts, updated with
  `successes_G` correct of `trials_G` rollouts."""
  successes_G, trials_G = np.asarray(successes_G, np.float64), np.asarray(trials_G, np.float64)
  prior_mean_G = np.broadcast_to(np.asarray(prior_mean_G, np.float64), successes_G.shape)
  if not prior_strength > 0:
    raise ValueError(f"prior_strength={prior_strength}: expected > 0 pseudo-rollouts")
  if np.any((prior_mean_G <= 0) | (prior_mean_G >= 1)):
    raise ValueError(f"prior mean {prior_mean_G.min():g}..{prior_mean_G.max():g}: expected "
                     "pass-rate priors in (0, 1)")
  if np.any(successes_G < 0) or np.any(successes_G > trials_G):
    raise ValueError("successes: expected 0 <= successes <= trials for every problem")
  return (prior_mean_G * prior_strength + successes_G) / (prior_strength + trials_G)


def check_bounds(num_problems: int, budget: int, n_min: int, n_max: int) -> None:
  """A budget the bounds can spend exactly; ValueError naming what is wrong."""
  if n_min < 1:
    raise ValueError(f"n_min={n_min}: expected >= 1 rollout per problem")
  if n_min > n_max:
    raise ValueError(f"n_min={n_min} is above n_max={n_max}")
  if budget < n_min * num_problems:
    raise ValueError(f"budget={budget} rollouts is below n_min={n_min} for each of "
                     f"{num_problems} problems ({n_min * num_problems})")
  if budget > n_max * num_problems:
    raise ValueError(f"budget={budget} rollouts is above n_max={n_max} for each of "
                     f"{num_problems} problems ({n_max * num_problems})")


def allocate(p_G, budget: int, n_min: int, n_max: int) -> np.ndarray:
  """[G] int rollouts per problem summing to `budget`, each in [n_min, n_max], that
  maximise sum_i q(p_i, n_i). Ties go to the lower index (deterministic)."""
  p_G = np.asarray(p_G, np.float64)
  if np.any((p_G < 0) | (p_G > 1)):
    raise ValueError("pass rates: expected values in [0, 1]")
  check_bounds(p_G.size, budget, n_min, n_max)
  n_G = np.full(p_G.size, n_min, np.int64)

  def gain(i: int) -> float:
    return float(mixed_group_probability(p_G[i], n_G[i] + 1)
                 - mixed_group_probability(p_G[i], n_G[i]))

  heap = [(-gain(i), i) for i in range(p_G.size) if n_G[i] < n_max]
  heapq.heapify(heap)
  for _ in range(budget - n_min * p_G.size):
    _, i = heapq.heappop(heap)
    n_G[i] += 1
    if n_G[i] < n_max:
      heapq.heappush(heap, (-gain(i), i))
  return n_G


@dataclasses.dataclass(frozen=True)
class Profile:
  """The training problems' priors: the profile's samples of each (c correct of k; 0 of
  0 where the problem was not profiled) and the Beta prior every estimate starts from."""
  successes_G: np.ndarray  # [num_train] float, correct samples in the profile
  trials_G: np.ndarray     # [num_train] float, the profile's samples
  prior_mean: float
  prior_strength: float

  @classmethod
  def of(cls, prompts: Sequence[str], rates: Mapping[str, float], samples: int,
         prior_mean: float, prior_strength: float) -> "Profile":
    """From a split's measured rates (prompt -> avg@`samples`) for the run's problems."""
    trials = np.array([samples if p in rates else 0 for p in prompts], np.float64)
    successes = np.array([rates.get(p, 0.0) * samples for p in prompts], np.float64)
    return cls(successes, trials, float(prior_mean), float(prior_strength))

  def estimate(self, ids, successes_G=None, trials_G=None) -> np.ndarray:
    """[len(ids)] pass-rate estimates of problems `ids`, from the profile and the run's own
    rollouts of every problem so far (`successes_G`, `trials_G`: [num_train], or None)."""
    ids = np.asarray(ids)
    successes, trials = self.successes_G[ids], self.trials_G[ids]
    if successes_G is not None:
      successes = successes + np.asarray(successes_G, np.float64)[ids]
      trials = trials + np.asarray(trials_G, np.float64)[ids]
    return pass_rate_estimate(successes, trials, self.prior_mean, self.prior_strength)
