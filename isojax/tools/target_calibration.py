"""Calibration of the testbeds' time-to-target ratio on synthetic runs with known truths.

The per_problem sections decide "the candidate reaches the baseline's peak with less
compute" per testbed from one baseline and one candidate run per seed
(`time_to_target.compare`, `ratio_effect`, `speedup_verdict`). This module draws such
seeds from a model with a known saving and runs that same code on them:

  value[arm, r, e] = base + (gain + s_{arm,r}) * shape(speedup_arm * c_e) + noise_{arm,r,e}

for arm (baseline: speedup 1; candidate: `speedup`), seed r and evaluation e at c_e
rollouts (E evaluations, the first at 0, evenly up to C): shape(c) = 1 - exp(-3 c / C)
rises and levels off; s ~ N(0, seed_sd) is a run's own level of gain; noise ~
N(0, eval_sd) is the evaluation's. Both arms of a seed share the first evaluation (one
base model, one evaluation). The truth is the statistic on the noiseless curves: with a
rising curve the baseline's peak is its last evaluation and the candidate reaches it at
C / speedup, rounded up to the next evaluation; with no gain, or no saving, it is 1.

A seed whose baseline peaks at its first evaluation has no time to a target (the run
never beat the base model): the statistic is undefined there and `ratio_effect`
refuses it; such studies are counted as undefined, not decided.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from isojax import run_dir
from isojax.tools import time_to_target

METRIC = "val/avg@4"


@dataclasses.dataclass(frozen=True)
class TargetModel:
  speedup: float = 1.0      # the candidate's curve is the baseline's at speedup x compute
  gain: float = 0.1         # the noiseless rise from the base to the curve's end
  seeds: int = 5
  evaluations: int = 11     # the first at 0 rollouts, evenly up to `budget`
  budget: int = 12800       # rollouts a run samples
  base: float = 0.3
  seed_sd: float = 0.02
  eval_sd: float = 0.01

  @property
  def rollouts_E(self) -> np.ndarray:
    return np.linspace(0, self.budget, self.evaluations)

  def curve(self, speedup: float, level: float | np.ndarray) -> np.ndarray:
    """[..., E] noiseless values of a run whose gain is `level`."""
    shape = 1.0 - np.exp(-3.0 * speedup * self.rollouts_E / self.budget)
    return self.base + np.asarray(level)[..., None] * shape


def truth(model: TargetModel) -> float:
  """The ratio on the noiseless curves (1 where there is no rise or no saving)."""
  if model.gain <= 0 or model.speedup == 1.0:
    return 1.0
  c_E = model.rollouts_E
  reached = c_E[model.curve(model.speedup, model.gain) >= model.curve(1.0, model.gain)[-1]
                - 1e-12]
  return float(reached[0] / c_E[-1])


def _lines(rollouts_E: np.ndarray, values_E: np.ndarray) -> list[dict]:
  return [{run_dir.STEP: e, run_dir.ROLLOUTS: float(c), run_dir.TOKENS: 0.0,
           run_dir.WALL_S: float(c), METRIC: float(v)}
          for e, (c, v) in enumerate(zip(rollouts_E, values_E))]


def sample_rows(model: TargetModel, rng: np.random.Generator) -> list[dict] | None:
  """One synthetic testbed: each seed's `time_to_target.compare` row, or None when a
  seed's baseline peaks at its first evaluation (the statistic is undefined)."""
  level_AR = model.gain + rng.normal(0.0, model.seed_sd, (2, model.seeds))
  values_ARE = np.stack([model.curve(1.0, level_AR[0]), model.curve(model.speedup,
                                                                    level_AR[1])])
  values_ARE = values_ARE + rng.normal(0.0, model.eval_sd, values_ARE.shape)
  values_ARE[1, :, 0] = values_ARE[0, :, 0]  # one base model, one first evaluation
  rows = []
  for r in range(model.seeds):
    row = time_to_target.compare(_lines(model.rollouts_E, values_ARE[0, r]),
                                 _lines(model.rollouts_E, values_ARE[1, r]), METRIC)
    if row["baseline"][run_dir.ROLLOUTS] == 0:
      return None
    rows.append(dict(row, seed=r))
  return rows


@dataclasses.dataclass(frozen=True)
class TargetRates:
  truth: float
  mean_estimate: float   # geometric mean over the defined studies
  coverage: float        # of the truth by the interval, over the defined studies
  yes: float
  no: float
  undefined: float       # studies with a seed whose baseline never beat its start


def rates(model: TargetModel, *, studies: int, level: float, seed: int = 0) -> TargetRates:
  """The testbeds' statistic and verdict (`ratio_effect` at `level`, `speedup_verdict`
  against 1) on `studies` synthetic testbeds: rates over the studies where it is
  defined, and the rate where it is not."""
  rng = np.random.default_rng(seed)
  target = truth(model)
  logs, covered, yes, no, undefined = [], 0, 0, 0, 0
  for _ in range(studies):
    rows = sample_rows(model, rng)
    if rows is None:
      undefined += 1
      continue
    effect = time_to_target.ratio_effect(rows, run_dir.ROLLOUTS, level=level)
    logs.append(math.log(effect["value"]))
    covered += effect["lo"] <= target <= effect["hi"]
    verdict = time_to_target.speedup_verdict(effect, 1.0)
    yes += verdict == "yes"
    no += verdict == "no"
  defined = max(studies - undefined, 1)
  return TargetRates(truth=target, mean_estimate=float(np.exp(np.mean(logs))) if logs
                     else float("nan"), coverage=covered / defined, yes=yes / defined,
                     no=no / defined, undefined=undefined / studies)
