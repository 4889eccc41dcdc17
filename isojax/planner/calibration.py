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

Claim 1's statistic (n*'s rise over the compute frontier) is a whole analysis (a
sigmoid fit per allocation, n* among near-ties), not a slope, so it gets its own model
with a known n*(C): `FrontierModel`. Claim 10's (the compute per-problem allocation needs
to reach the uniform frontier's best value) uses the same curves, the per-problem arm's
reached a known factor sooner: `TimeToValueModel`.

`tests/planner/test_calibration.py` asserts the rates; `launch.reproduce --sections=
calibration` writes them as a table (docs/results/calibration.md, quoted in
docs/study.md).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from isojax import metrics
from isojax.planner import bootstrap
from isojax.planner import experiments
from isojax.planner import n_star
from isojax.planner import sigmoid_fit
from isojax.planner import time_to_value
from isojax.planner import verdicts

NUM_EVALS = 3   # a run's last evaluations; its final value is the last (`experiments.TAIL`)


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


# --- Claim 1: a sweep with a known n*(C) -----------------------------------------------


@dataclasses.dataclass(frozen=True)
class FrontierModel:
  """A synthetic iso-compute sweep whose n*(C) is known. Allocation n's mean curve is
  the ScaleRL sigmoid R(C) = r0 + (A_n - r0) / (1 + (C_mid,n / C)^b) with

    A_n = asymptote + gain_per_doubling * min(log2 n, gain_stops_at),
    C_mid,n = c_mid * n^delay_exponent,

  so larger n ends higher but rises later: small n leads early, large n late, and the
  true n* at any C is the rule (`n_star.n_star_centre`) applied to these curves.
  gain_per_doubling = delay_exponent = 0 is the null: every n on one curve, rise 0.
  A run of allocation a, seed r on validation problem g at evaluation e:

    value = R_n(C_e) + [C_e > 0] s_{a,r} + u_g + e_{a,r,e,g},

  with s ~ N(0, seed_sd) a run's level (its base model, at C = 0, is shared), u_g ~
  N(0, problem_sd) a problem's difficulty (shared by every run) and e ~ N(0, eval_sd)
  evaluation noise. Evaluations at C = budget * e / evaluations, e = 0..evaluations."""
  gain_per_doubling: float = 0.05
  gain_stops_at: float = math.inf
  delay_exponent: float = 0.5
  r0: float = 0.2
  asymptote: float = 0.35
  b: float = 1.5
  c_mid: float = 2000.0
  seed_sd: float = 0.03
  problem_sd: float = 0.1
  eval_sd: float = 0.12
  seeds: int = 3
  problems: int = 256
  evaluations: int = 12
  budget: float = 65536.0
  problems_per_batch: tuple[int, ...] = (8, 16)
  rollouts_per_problem: tuple[int, ...] = (2, 4, 8, 16, 32, 64)

  def mean_curve(self, n: int) -> sigmoid_fit.SigmoidFit:
    """Allocation n's true curve (the same for every B_p)."""
    a = self.asymptote + self.gain_per_doubling * min(math.log2(n), self.gain_stops_at)
    return sigmoid_fit.SigmoidFit(
        r0=self.r0, a=a, b=self.b, c_mid=self.c_mid * n ** self.delay_exponent,
        a_stderr=0.0, rmse=0.0, num_points=self.evaluations + 1,
        compute_range=(0.0, self.budget), r0_fixed=True)

  @property
  def compute_E(self) -> np.ndarray:
    return self.budget * np.arange(self.evaluations + 1) / self.evaluations


def true_rise(model: FrontierModel) -> float:
  """Claim 1's estimand: the rule's n* rise on the true curves, at the rule's points
  for this design (C_end the budget, the first evaluation the range's start)."""
  fits_by_n = {n: [model.mean_curve(n)] for n in model.rollouts_per_problem}
  start, end, _ = n_star.n_star_at_claim1_points(
      fits_by_n, model.budget, float(model.compute_E[1]), verdicts.EQUIVALENCE_MARGIN)
  return end - start


def sample_frontier_runs(model: FrontierModel, rng: np.random.Generator, *,
                         u_G: np.ndarray | None = None, speedup: float = 1.0
                         ) -> list[bootstrap.ProblemCurve]:
  """One synthetic sweep: a run per allocation and seed, [evaluations + 1, problems].
  `u_G`: the problems' difficulties (drawn when None); `speedup`: every mean curve
  reached that many times sooner, R_n(speedup * C)."""
  c_E = model.compute_E
  trained_E = (c_E > 0).astype(np.float64)
  if u_G is None:
    u_G = rng.normal(0.0, model.problem_sd, model.problems)
  runs = []
  for b_p in model.problems_per_batch:
    for n in model.rollouts_per_problem:
      mean_E = model.mean_curve(n).predict(speedup * c_E)
      for seed in range(model.seeds):
        level_E = mean_E + trained_E * rng.normal(0.0, model.seed_sd)
        values_EG = level_E[:, None] + u_G[None, :] + rng.normal(
            0.0, model.eval_sd, (c_E.size, model.problems))
        runs.append(bootstrap.ProblemCurve(
            path=f"bp{b_p}_n{n}_s{seed}", problems_per_batch=b_p, rollouts_per_problem=n,
            seed=seed, rollouts_E=c_E, values_EG=values_EG))
  return runs


@dataclasses.dataclass(frozen=True)
class FrontierRates:
  """Claim 1's statistic over synthetic studies of one `FrontierModel`."""
  truth: float             # `true_rise`
  mean_estimate: float     # the statistic's mean over studies (NaN ones left out)
  coverage: float          # the fraction of studies whose 90% interval holds the truth
  decided: float           # the fraction with a yes or a no at raw p < 0.10: the error
                           # rate for a null, the power (yes) for a planted rise
  undefined: float         # the fraction where no fit rose (statistic undefined)


def frontier_rates(model: FrontierModel, *, studies: int, resamples: int,
                   seed: int = 0) -> FrontierRates:
  """Claim 1 through the study's own code (`n_star.frontier_stats`,
  `bootstrap.bootstrap`, `bootstrap.interval`, `bootstrap.p_value`) on `studies`
  synthetic sweeps of `model`. An undefined statistic counts as not covering and not
  deciding. A single test at raw p: in the study it is one of the primary family, whose
  Holm adjustment only makes it stricter."""
  truth = true_rise(model)
  metric = metrics.val_avg(4)
  rng = np.random.default_rng(seed)
  estimates, covered, decided, undefined = [], 0, 0, 0
  for _ in range(studies):
    groups = {"runs": sample_frontier_runs(model, rng)}
    point, out = bootstrap.bootstrap(
        groups, lambda g: {"rise": n_star.frontier_stats(g["runs"], metric)[
            "n_star_rise"]}, num_resamples=resamples, seed=int(rng.integers(2**31)))
    e = bootstrap.effect(point["rise"], out["rise"])
    if not (math.isfinite(e["value"]) and math.isfinite(e["lo"])):
      undefined += 1
      continue
    estimates.append(e["value"])
    covered += e["lo"] <= truth <= e["hi"]
    verdict = bootstrap.p_verdict(e["value"], bootstrap.effect_p_value(e))
    decided += (verdict == bootstrap.YES) if truth > 0 else (verdict != bootstrap.INCONCLUSIVE)
  return FrontierRates(truth=truth, mean_estimate=float(np.mean(estimates)) if estimates
                       else math.nan, coverage=covered / studies,
                       decided=decided / studies, undefined=undefined / studies)


# --- Claim 10: a per-problem arm with a known saving ------------------------------------


@dataclasses.dataclass(frozen=True)
class TimeToValueModel:
  """A synthetic `per_problem` sweep (configs/sweep_per_problem.py's design: B_p 16,
  n from 4 to 64, both arms at every allocation): the uniform arm is `frontier`'s sweep
  and the per-problem arm the same curves reached `speedup` times sooner, R_n(speedup *
  C), evaluated on the same validation problems (one u_g for both arms). speedup 1 is the
  null: both arms on one curve, truth 0."""
  speedup: float = 2.0
  frontier: FrontierModel = FrontierModel(problems_per_batch=(16,),
                                          rollouts_per_problem=(4, 8, 16, 32, 64))


def sample_time_to_value_runs(model: TimeToValueModel, rng: np.random.Generator
                              ) -> dict[str, list[bootstrap.ProblemCurve]]:
  """One synthetic per_problem sweep: {variant: its runs}."""
  u_G = rng.normal(0.0, model.frontier.problem_sd, model.frontier.problems)
  return {"uniform": sample_frontier_runs(model.frontier, rng, u_G=u_G),
          "per_problem": sample_frontier_runs(model.frontier, rng, u_G=u_G,
                                              speedup=model.speedup)}


def _log2_ratio(groups) -> dict[str, float]:
  stats = time_to_value.per_problem_stats(groups["uniform"], groups["per_problem"],
                                          tail=experiments.TAIL)
  return {"ratio": stats["log2_compute_ratio"], "reached": stats["reached"]}


def true_log2_ratio(model: TimeToValueModel) -> float:
  """Claim 10's estimand: the statistic on the true curves (one noiseless run per
  allocation), at this design's evaluations."""
  f = model.frontier
  c_E = f.compute_E

  def arm(speedup: float) -> list:
    return [bootstrap.ProblemCurve(
        path=f"n{n}", problems_per_batch=b_p, rollouts_per_problem=n, seed=0,
        rollouts_E=c_E, values_EG=f.mean_curve(n).predict(speedup * c_E)[:, None]).curve()
            for b_p in f.problems_per_batch for n in f.rollouts_per_problem]
  return _log2_ratio({"uniform": arm(1.0), "per_problem": arm(model.speedup)})["ratio"]


def time_to_value_rates(model: TimeToValueModel, *, studies: int, resamples: int,
                        seed: int = 0) -> FrontierRates:
  """Claim 10 through the study's own code (`time_to_value.per_problem_stats` in
  `bootstrap.bootstrap`, decided as the findings row is: `bootstrap.sign_verdict`, a
  saving expected) on `studies` synthetic sweeps. `decided` is the rate of yes for a
  planted saving and of any yes or no for the null; `undefined` is the rate at which
  the per-problem arm never reached the target (its largest compute stands in)."""
  truth = true_log2_ratio(model)
  rng = np.random.default_rng(seed)
  estimates, covered, decided, unreached = [], 0, 0, 0
  for _ in range(studies):
    groups = sample_time_to_value_runs(model, rng)
    point, out = bootstrap.bootstrap(groups, _log2_ratio, num_resamples=resamples,
                                     seed=int(rng.integers(2**31)))
    e = bootstrap.effect(point["ratio"], out["ratio"])
    unreached += not point["reached"]
    estimates.append(e["value"])
    covered += e["lo"] <= truth <= e["hi"]
    verdict = bootstrap.sign_verdict(e, expected=-1)
    decided += (verdict == bootstrap.YES) if truth < 0 else (verdict != bootstrap.INCONCLUSIVE)
  return FrontierRates(truth=truth, mean_estimate=float(np.mean(estimates)),
                       coverage=covered / studies, decided=decided / studies,
                       undefined=unreached / studies)
