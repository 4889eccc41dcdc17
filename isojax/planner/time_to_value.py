"""Claim 10's statistic: the compute per-problem allocation needs to reach the uniform
frontier's best value, over the compute the uniform allocations need.

A `per_problem` sweep runs the same allocations (B_p, n) twice: `uniform` (n rollouts for
every problem) and `per_problem` (each step's B_p * n split among its problems by their
estimated pass rates). Each allocation's curve is the mean over its seeds at its
evaluations (the seeds of an allocation share its schedule). The target V is the best
final value of any uniform allocation (`experiments.final_value`: its last evaluation);
an arm reaches it at the first evaluation, over all its allocations, whose mean value is
at least V. The uniform arm always does (the best allocation's last evaluation is V).
The statistic is log2 of the per-problem arm's rollouts at that point over the uniform
arm's: below 0, per-problem allocation gets there with less compute. Where no
per-problem allocation reaches V, its largest compute stands in (a lower bound) and
`reached` is 0.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from isojax.planner import records

VARIANTS = ("uniform", "per_problem")


def allocation_means(curves: Sequence[records.RunCurve], tail: int
                     ) -> list[tuple[np.ndarray, np.ndarray, float]]:
  """Per allocation: (rollouts [E], mean value over its seeds [E], mean final value)."""
  by_key: dict[tuple[int, int], list[records.RunCurve]] = {}
  for c in curves:
    by_key.setdefault(c.key, []).append(c)
  out = []
  for key in sorted(by_key):
    members = by_key[key]
    shortest = min(m.rollouts_E.size for m in members)
    rollouts_E = members[0].rollouts_E[:shortest]
    if any(not np.array_equal(m.rollouts_E[:shortest], rollouts_E) for m in members):
      raise ValueError(f"allocation B_p={key[0]}, n={key[1]}: its seeds were evaluated at "
                       "different rollouts; expected one schedule per allocation")
    values_E = np.mean([m.values_E[:shortest] for m in members], axis=0)
    out.append((rollouts_E, values_E, float(values_E[-tail:].mean())))
  return out


def first_reach(means, target: float) -> float:
  """The fewest rollouts (> 0: the base model, shared by both arms, is not a point of
  either) at which any allocation's mean curve is at least `target` (inf: none is)."""
  reached = []
  for r_E, v_E, _ in means:
    hit = (v_E >= target) & (r_E > 0)
    if hit.any():
      reached.append(float(r_E[np.argmax(hit)]))
  return min(reached, default=math.inf)


def per_problem_stats(uniform: Sequence[records.RunCurve],
                      per_problem: Sequence[records.RunCurve], *, tail: int
                      ) -> dict[str, float]:
  """The target, each arm's best final value, and log2 of the compute ratio to reach it."""
  uni, pp = allocation_means(uniform, tail), allocation_means(per_problem, tail)
  target = max(final for _, _, final in uni)
  c_uniform, c_per_problem = first_reach(uni, target), first_reach(pp, target)
  reached = math.isfinite(c_per_problem)
  if not reached:
    c_per_problem = max(float(r_E[-1]) for r_E, _, _ in pp)
  return {"uniform_best": target, "per_problem_best": max(final for _, _, final in pp),
          "log2_compute_ratio": math.log2(c_per_problem / c_uniform),
          "reached": 1.0 if reached else 0.0}
