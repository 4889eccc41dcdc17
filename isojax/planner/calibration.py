"""Calibration of the verdict machinery on synthetic sweeps with known truths.

A statistic's interval is only evidence if it covers the truth at its nominal rate,
and a family of verdicts only if a null (no effect of n) yields a yes or a no at most
at the nominal family-wise rate. This module draws whole synthetic sweeps in memory,
as `bootstrap.ProblemCurve`s, from a model with the variance components a real sweep
has, runs the same bootstrap and decision code as a study, and counts:

  value[a, r, g] = base + (slope + v_g) * log2 n_a + s_{a,r} + e_{a,r,g}

for allocation a, seed r and validation problem g: `slope` is the true change per
doubling of n (claims 2a, 2b and 5 measure such a slope of final values); v_g ~
N(0, problem_sd) lets each problem respond to n differently, so the slope measured on
one problem set differs from the population's; s ~ N(0, seed_sd) is run-to-run
variance (isojax's own seed spread is about 0.03 in avg@4); e ~ N(0, eval_sd) is the
evaluation noise of one problem in one run. The truth is the population slope.

`tests/planner/test_calibration.py` asserts the rates; `launch.reproduce --sections=
calibration` writes them as a table (docs/results/calibration.md, quoted in
docs/study.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from isojax.planner import bootstrap
from isojax.planner import experiments

NUM_EVALS = 3   # a run's last evaluations; its final value averages the last two


@dataclasses.dataclass(frozen=True)
class Model:
  """A synthetic iso-compute sweep: every (B_p, n) run with `seeds` seeds."""
  slope: float = 0.02             # true change of the final value per doubling of n
  seed_sd: float = 0.03           # run-to-run SD of a run's level (the hard demo's finals
                                  # over seeds: 0.016; 1M-rollout n = 32: 0.097)
  problem_sd: float = 0.02        # SD over problems of each problem's own slope
  eval_sd: float = 0.12           # avg@4 of one problem from 16 samples at p = 0.3:
                                  # sqrt(0.3 * 0.7 / 16) = 0.115
  seeds: int = 3
  problems: int = 256             # the study's validation problems
  problems_per_batch: tuple[int, ...] = (8, 16)
  rollouts_per_problem: tuple[int, ...] = (2, 4, 8, 16, 32, 64)


def sample_runs(model: Model, rng: np.random.Generator) -> list[bootstrap.ProblemCurve]:
  """One synthetic sweep: a run per allocation and seed, [NUM_EVALS, problems] values."""
  v_G = rng.normal(0.0, model.problem_sd, model.problems)
  runs = []
  for b_p in model.problems_per_batch:
    for n in model.rollouts_per_problem:
      x = np.log2(n)
      for seed in range(model.seeds):
        level = 0.3 + model.slope * x + rng.normal(0.0, model.seed_sd)
        values_EG = (level + v_G * x)[None, :] + rng.normal(
            0.0, model.eval_sd, (NUM_EVALS, model.problems))
        runs.append(bootstrap.ProblemCurve(
            path=f"bp{b_p}_n{n}_s{seed}", problems_per_batch=b_p, rollouts_per_problem=n,
            seed=seed, rollouts_E=np.arange(1.0, NUM_EVALS + 1), values_EG=values_EG))
  return runs


def _slope(groups) -> dict[str, float]:
  return {"slope": experiments.final_slope_log2_n(groups["runs"])}


def _plain_draw(groups: bootstrap.Groups, rng: np.random.Generator):
  """A replicate that draws seeds with replacement but does not restore their
  variance (what `bootstrap._replicate` did before its correction)."""
  chosen = {name: [members[i] for members in bootstrap.by_allocation(runs).values()
                   for i in rng.integers(0, len(members), len(members))]
            for name, runs in groups.items()}
  (size,) = {c.num_problems for runs in groups.values() for c in runs}
  draw = rng.integers(0, size, size)
  return {name: [c.curve(draw) for c in runs] for name, runs in chosen.items()}


def coverage(model: Model, *, studies: int, resamples: int, seed: int = 0,
             plain: bool = False) -> float:
  """The fraction of `studies` synthetic sweeps whose 90% interval of the slope covers
  the true slope (`plain`: with `_plain_draw`'s replicates instead of the study's)."""
  rng = np.random.default_rng(seed)
  covered = 0
  for _ in range(studies):
    groups = {"runs": sample_runs(model, rng)}
    if plain:
      samples = [_slope(_plain_draw(groups, rng))["slope"] for _ in range(resamples)]
    else:
      _, out = bootstrap.bootstrap(groups, _slope, num_resamples=resamples,
                                   seed=int(rng.integers(2**31)))
      samples = out["slope"]
    lo, hi = bootstrap.interval(samples)
    covered += lo <= model.slope <= hi
  return covered / studies


def family_error(models: Sequence[Model], *, studies: int, resamples: int,
                 seed: int = 0) -> tuple[float, float]:
  """(adjusted, raw): the fraction of studies, each one sweep per model (a family of
  primary tests), in which any verdict is a yes or a no although every model's slope is
  0, deciding on Holm-adjusted bootstrap p-values (the study's rule) and on raw ones."""
  if any(m.slope != 0.0 for m in models):
    raise ValueError("family_error needs null models (slope 0)")
  rng = np.random.default_rng(seed)
  errors = {"adjusted": 0, "raw": 0}
  for _ in range(studies):
    values, p_values = [], []
    for model in models:
      groups = {"runs": sample_runs(model, rng)}
      point, out = bootstrap.bootstrap(groups, _slope, num_resamples=resamples,
                                       seed=int(rng.integers(2**31)))
      values.append(point["slope"])
      p_values.append(bootstrap.p_value(out["slope"]))
    for name, ps in (("adjusted", bootstrap.holm(p_values)), ("raw", p_values)):
      errors[name] += any(bootstrap.p_verdict(v, p) != bootstrap.INCONCLUSIVE
                          for v, p in zip(values, ps))
  return errors["adjusted"] / studies, errors["raw"] / studies


def power(model: Model, *, studies: int, resamples: int, family: int = 3,
          seed: int = 0) -> float:
  """The fraction of studies in which a planted slope is found (yes) at Holm-adjusted
  p < 0.10 in a family of `family` tests whose other members are null (the least
  favourable case for Holm: the planted test is adjusted by the whole family)."""
  rng = np.random.default_rng(seed)
  found = 0
  for _ in range(studies):
    groups = {"runs": sample_runs(model, rng)}
    point, out = bootstrap.bootstrap(groups, _slope, num_resamples=resamples,
                                     seed=int(rng.integers(2**31)))
    p = bootstrap.p_value(out["slope"])
    found += bootstrap.p_verdict(point["slope"], min(1.0, p * family)) == bootstrap.YES
  return found / studies


def slope_power(slope: float, run_sd: float, rollouts_per_problem: Sequence[int], *,
                problems_per_batch: int = 2, seeds: int = 3, family: int = 3,
                alpha: float = 1.0 - bootstrap.DEFAULT_LEVEL) -> float:
  """The normal-approximation power of finding a slope of final values on log2 n (claims
  2a, 2b, 5) at Holm's strictest threshold alpha / family (two-sided), for a design of
  `problems_per_batch` values of B_p x the given n x `seeds` seeds, when a run's final
  value has SD `run_sd` around its allocation's mean (seed variance plus its evaluation
  noise: what a pilot's seed-to-seed SD measures). The size calculation the playbook
  asks for before a study; `test_calibration` checks it against `power`'s simulation."""
  from scipy import stats
  x = np.log2(np.repeat(np.asarray(rollouts_per_problem, float), problems_per_batch * seeds))
  se = run_sd / math.sqrt(float(((x - x.mean()) ** 2).sum()))
  z = stats.norm.ppf(1.0 - alpha / (2.0 * family))
  return float(stats.norm.cdf(abs(slope) / se - z) + stats.norm.cdf(-abs(slope) / se - z))
