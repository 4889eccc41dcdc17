"""Synthetic sweeps with known curves: ground truth for tests, `launch.bench_analyze`
and the planner figure of `launch.demo_analysis`.

`paper_like_curves` builds one ScaleRL sigmoid per allocation (B_p, n) with the
qualitative shape the paper reports: the asymptote A grows with n and stops
growing at a saturation n, while the half-gain compute C_mid grows with n
(large n starts slower). So small n wins at small compute, larger n at larger
compute, and n*(C) rises then saturates. `write_sweep` writes those curves, plus
noise, as real run directories (`isojax.run_dir` layout). Each run's config.json holds
the fields that describe it (allocation, seed, evaluation) over the defaults: a config
`configs/from_json.py` reads, written without the config layer.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from isojax import metrics
from isojax import run_dir
from isojax.planner import sigmoid_fit


@dataclasses.dataclass(frozen=True)
class TrueCurve:
  problems_per_batch: int
  rollouts_per_problem: int
  r0: float
  a: float
  b: float
  c_mid: float

  @property
  def key(self) -> tuple[int, int]:
    return (self.problems_per_batch, self.rollouts_per_problem)

  def __call__(self, compute) -> np.ndarray:
    return sigmoid_fit.sigmoid(compute, self.r0, self.a, self.b, self.c_mid)


def paper_like_curves(problems: Sequence[int], rollouts: Sequence[int], *,
                      r0: float = 0.1, a_min: float = 0.45, a_max: float = 0.8,
                      n_saturation: int = 64, b: float = 1.2,
                      c_mid_base: float = 2e3) -> list[TrueCurve]:
  """One curve per (B_p, n) in problems x rollouts, sorted by (B_p, n).

  A(n) = a_max - (a_max - a_min) * n_min / min(n, n_saturation) (+0.005 per
  doubling of B_p), C_mid(n) = c_mid_base * n / n_min * sqrt(B_p / B_p_min).
  """
  n_min, bp_min = min(rollouts), min(problems)
  curves = []
  for b_p in sorted(problems):
    for n in sorted(rollouts):
      a = a_max - (a_max - a_min) * n_min / min(n, n_saturation)
      a += 0.005 * math.log2(b_p / bp_min)
      c_mid = c_mid_base * (n / n_min) * math.sqrt(b_p / bp_min)
      curves.append(TrueCurve(b_p, n, r0, a, b, c_mid))
  return curves


def _run_config(curve: TrueCurve, num_steps: int, eval_every: int, seed: int,
                num_samples: int) -> dict:
  """The run's fields over the config defaults (C = B_p * n * M, as `resolve` derives)."""
  return dict(seed=seed, problems_per_batch=curve.problems_per_batch,
              rollouts_per_problem=curve.rollouts_per_problem, num_steps=num_steps,
              budget_rollouts=curve.problems_per_batch * curve.rollouts_per_problem * num_steps,
              eval=dict(every=eval_every, num_samples=num_samples))


_BETA_CONCENTRATION = 2.0


def _beta_moment(mean: float, k: int) -> float:
  """E[p^k] for p ~ Beta with the given mean and concentration alpha + beta = 2."""
  alpha = mean * _BETA_CONCENTRATION
  return float(np.prod([(alpha + i) / (_BETA_CONCENTRATION + i) for i in range(k)]))


def write_sweep(root: str, curves: Sequence[TrueCurve], *, budget_rollouts: int | None = None,
                num_evals: int = 50, noise: float = 0.01, seed: int = 0,
                k: int = 4, tokens_per_rollout: int = 8, seeds_per_curve: int = 1,
                log_spaced: bool = False, num_problems: int = 0, num_samples: int = 8,
                num_steps: int | None = None) -> list[str]:
  """Writes one run per curve (and seed), all spending `budget_rollouts` (or all
  running `num_steps` updates).

  Each run evaluates `num_evals` times from step 0 (C = 0) to its last step
  M = C / (B_p * n), evenly in steps (or, with log_spaced, geometrically from
  step 1), fewer when M has fewer distinct steps; avg@k is the true curve
  plus N(0, noise^2). best@k and worst@k are those of a problem set whose pass
  rates are Beta-distributed with mean avg and concentration alpha + beta = 2
  (a heterogeneous mix): worst@k = E[p^k], best@k = 1 - E[(1 - p)^k].

  With num_problems > 0 each evaluation instead draws, for each of that many
  validation problems, Binomial(num_samples, true curve) correct samples, logs them
  as `val/correct_counts` and the metrics they give (as isojax.run.evaluation does):
  the noise is then the sampling noise of a finite problem set, and avg@k's
  expectation is exactly the true curve. Returns the run paths.
  """
  if (budget_rollouts is None) == (num_steps is None):
    raise ValueError("give exactly one of budget_rollouts and num_steps")
  rng = np.random.default_rng(seed)
  paths = []
  for curve in curves:
    batch = curve.problems_per_batch * curve.rollouts_per_problem
    run_steps = num_steps if num_steps is not None else max(budget_rollouts // batch, 1)
    if log_spaced:
      spaced = np.concatenate([[0], np.geomspace(1, run_steps, num_evals - 1)])
    else:
      spaced = np.linspace(0, run_steps, num_evals)
    steps_E = np.unique(np.round(spaced).astype(int))
    eval_every = max(run_steps // max(num_evals - 1, 1), 1)
    for s in range(seeds_per_curve):
      path = os.path.join(root, f"bp{curve.problems_per_batch}_n{curve.rollouts_per_problem}"
                                f"_s{s}")
      run_dir.write_config(path, _run_config(curve, run_steps, eval_every, s, num_samples))
      writer = run_dir.MetricsWriter(path)
      c_E = steps_E * batch
      avg_E = np.clip(curve(c_E) + rng.normal(0.0, noise, c_E.shape), 0.0, 1.0)
      for step, c, avg in zip(steps_E, c_E, avg_E):
        line = {run_dir.STEP: int(step), run_dir.ROLLOUTS: int(c),
                run_dir.TOKENS: int(c) * tokens_per_rollout, run_dir.WALL_S: 0.01 * int(step)}
        if num_problems:
          counts_G = rng.binomial(num_samples, float(curve(np.array([c]))[0]), num_problems)
          line.update(metrics.summarize_correct(counts_G, num_samples, k))
          line[metrics.VAL_CORRECT_COUNTS] = counts_G.tolist()
        else:
          line.update({metrics.val_avg(k): float(avg),
                       metrics.val_best(k): 1.0 - _beta_moment(1.0 - avg, k),
                       metrics.val_worst(k): _beta_moment(avg, k)})
        writer.write(line)
      paths.append(path)
  return paths


# The demo sweep of the planner figure (docs/img/planner_metric_vs_compute.png) and
# colabs/planner.ipynb: n* saturates at 32.
DEMO_PROBLEMS = (16, 64)
DEMO_ROLLOUTS = (2, 4, 8, 16, 32, 64, 128)
DEMO_N_SATURATION = 32
DEMO_BUDGET = 1 << 21


def write_demo_sweep(root: str, *, problems: Sequence[int] = DEMO_PROBLEMS,
                     rollouts: Sequence[int] = DEMO_ROLLOUTS,
                     budget_rollouts: int = DEMO_BUDGET, num_evals: int = 40) -> list[str]:
  """A sweep of paper-like curves (n* saturating at n = 32), every run spending
  `budget_rollouts` in `num_evals` log-spaced evaluations with noise sd 0.01."""
  curves = paper_like_curves(problems, rollouts, n_saturation=DEMO_N_SATURATION,
                             c_mid_base=budget_rollouts / 4000)
  return write_sweep(root, curves, budget_rollouts=budget_rollouts, num_evals=num_evals,
                     noise=0.01, seed=0, log_spaced=True)
