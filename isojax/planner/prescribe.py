"""Prescriptions: (n, B_p, M) and the learning rate for a sampling budget C.

The IsoCompute paper's practical rule (its finding 4): set n from the n*(C)
law for the budget, keep B_p moderate and fixed, and let M absorb the rest. The
law is either fitted on a sweep (`analysis.json` from `launch.analyze`) or, with
no sweep yet, one of `PAPER_DEFAULTS` below. The learning rate follows the
config's batch-size rule (the square-root rule in the recipes) applied to the batch the
update trains on (B_p * m: PODS trains on m of the n rollouts): the config keeps
`optim.learning_rate` at the reference batch and the run scales it. Every figure a
prescription reports that the run also derives (its peak LR, steps, rollouts sampled
and trained per step) is read from the run's own settings
(`isojax.config.run_settings.RunSettings` of the config the prescription writes, `run_figures`),
so the plan and the run cannot drift apart. Everything here is deterministic.

A base run config is read as a nested mapping (a ConfigDict, or a plain dict such as
its `to_dict()`), and `to_config` returns a plain dict: the planner imports nothing
of the config layer. The caller validates what it writes (`config_lib.resolve_dict`,
as `configs/from_json.py` and `isojax.main` will when the file is run).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

from isojax import storage
from isojax.config import run_settings
from isojax.planner import frontier
from isojax.planner import grids

# A run config as the planner reads it: nested field names to values.
RunConfig = Mapping[str, Any]

# Paper-derived default n*(C) laws, for when no sweep has been fitted yet.
#
# They encode the shape the IsoCompute paper reports for Qwen2.5-7B, not fitted
# coefficients it publishes: n* starts at n_low = 8 (the smallest n of its sweep)
# and saturates at n = 128 on the hard set (B_max = 16,384) and n = 512 on the
# easy set (B_max = 65,536); log2 n* is a sigmoid of log C with b = 1, so the
# rise from 10% to 90% spans a factor 81 of compute. Both saturate with
# B_p = B_max / n_sat = 128 problems per full batch. The compute axis is scaled
# by B_max: the midpoint is c_mid = 32 * B_max rollouts (32 updates at the largest
# batch), so the law transfers to smaller hardware (the tiny CPU presets) by its
# batch size; n itself is then capped by B_max / B_p_min in the prescription.
# Replace these with a fitted law (`--analysis=`) as soon as a sweep exists.
PAPER_DEFAULTS: dict[str, dict[str, float]] = {
    "hard": dict(n_low=8, n_saturation=128, b=1.0, c_mid_batches=32,
                 paper_max_batch_rollouts=16384),
    "easy": dict(n_low=8, n_saturation=512, b=1.0, c_mid_batches=32,
                 paper_max_batch_rollouts=65536),
}


def default_law(difficulty: str, max_batch_rollouts: int) -> frontier.NStarLaw:
  """The paper-derived default law of `difficulty` for a largest batch B_max."""
  if difficulty not in PAPER_DEFAULTS:
    raise ValueError(f"difficulty={difficulty!r}: expected one of {sorted(PAPER_DEFAULTS)}")
  d = PAPER_DEFAULTS[difficulty]
  c_mid = d["c_mid_batches"] * max_batch_rollouts
  return frontier.NStarLaw(
      log2_n_low=math.log2(d["n_low"]), log2_n_high=math.log2(d["n_saturation"]),
      b=d["b"], c_mid=float(c_mid),
      # The range the shape describes: from one to 1,024 updates at B_max.
      compute_range=(float(max_batch_rollouts), 1024.0 * max_batch_rollouts),
      source=f"paper default ({difficulty})")


def difficulty_of(config: RunConfig) -> str:
  """'easy' when the config uses the easy recipe's KL anchor, else 'hard'."""
  return "easy" if config["rl"]["kl_coef"] > 0 else "hard"


NO_LAW = "no `n_star_fit`"   # load_law's words for a fit without an n*(C) law


def load_law(analysis_path: str) -> frontier.NStarLaw:
  """The n*(C) law of an analysis.json written by `launch.analyze`."""
  try:
    data = storage.read_json(analysis_path)
  except FileNotFoundError as e:
    raise ValueError(f"analysis file {analysis_path!r} does not exist") from e
  law = data.get("n_star_fit") if isinstance(data, dict) else None
  if not law:
    raise ValueError(f"{analysis_path}: {NO_LAW} (the sweep's frontier had too few "
                     "points to fit n*(C), or no allocation's fit rose above a flat line); "
                     "pass no --analysis to use the paper defaults")
  if law.get("unit", "rollouts") != "rollouts":
    raise ValueError(f"{analysis_path}: n_star_fit is in {law['unit']!r}, expected rollouts")
  return dataclasses.replace(frontier.NStarLaw.from_dict(law), source=f"fit ({analysis_path})")


def choose_allocation(budget_rollouts: int, n_target: float, *, max_batch_rollouts: int,
                      problems_range: Sequence[int], rollouts_range: Sequence[int],
                      preferred_problems: int, min_steps: int = 1) -> grids.Allocation:
  """The allocation for a target n: the power of two nearest n_target (in log2),
  lowered until some B_p fits; B_p the power of two nearest `preferred_problems`
  among those with B_p * n <= B_max and M = C // (B_p * n) >= min_steps (ties to
  the smaller B_p). Raises BudgetTooSmallError when nothing fits."""
  feasible = grids.iso_compute_grid(budget_rollouts, max_batch_rollouts, problems_range,
                                    rollouts_range, min_steps=min_steps, exact=False)
  n_options = sorted({a.rollouts_per_problem for a in feasible})
  target = math.log2(max(n_target, 1.0))
  # The largest feasible n not above the rounded target, else the smallest one.
  rounded = 2.0 ** math.floor(target + 0.5)
  n = max([x for x in n_options if x <= rounded], default=n_options[0])
  candidates = [a for a in feasible if a.rollouts_per_problem == n]
  log_pref = math.log2(max(preferred_problems, 1))
  return min(candidates,
             key=lambda a: (abs(math.log2(a.problems_per_batch) - log_pref),
                            a.problems_per_batch))


@dataclasses.dataclass(frozen=True)
class Prescription:
  allocation: grids.Allocation
  budget_rollouts_requested: int
  n_star: float                 # the law's continuous n*(C)
  law: frontier.NStarLaw
  learning_rate: float          # optim.learning_rate, at lr_reference_batch
  lr_reference_batch: int
  lr_scaling: str
  run: RunFigures               # what the run derives from the written config

  @property
  def effective_learning_rate(self) -> float:
    """The peak LR the run will use (the run's own figure, `run`)."""
    return self.run.effective_learning_rate

  @property
  def extrapolated(self) -> bool:
    lo, hi = self.law.compute_range
    return not lo <= self.budget_rollouts_requested <= hi

  def to_dict(self) -> dict[str, Any]:
    a = self.allocation
    return {
        "rollouts_per_problem": a.rollouts_per_problem,
        "problems_per_batch": a.problems_per_batch,
        "num_steps": a.num_steps,
        "batch_rollouts": a.batch_rollouts,
        "budget_rollouts": a.rollouts,
        "budget_rollouts_requested": self.budget_rollouts_requested,
        "n_star": self.n_star,
        "learning_rate": self.learning_rate,
        **self.run.to_dict(),
        "lr_reference_batch": self.lr_reference_batch,
        "lr_scaling": self.lr_scaling,
        "extrapolated": self.extrapolated,
        "law": self.law.to_dict(),
    }


def _problems_range(config: RunConfig, problems_range):
  lo, hi = problems_range
  return lo, min(hi, config["task"]["num_train"])  # resolve() rejects B_p > num_train


def prescribe(budget_rollouts: int, law: frontier.NStarLaw, base: RunConfig, *,
              max_batch_rollouts: int, problems_range: Sequence[int],
              rollouts_range: Sequence[int], min_steps: int = 1) -> Prescription:
  """n from the law at C, B_p kept near the base config's, M = C // (B_p * n)."""
  n_star = float(law.n_star(budget_rollouts))
  allocation = choose_allocation(
      budget_rollouts, n_star, max_batch_rollouts=max_batch_rollouts,
      problems_range=_problems_range(base, problems_range), rollouts_range=rollouts_range,
      preferred_problems=base["problems_per_batch"], min_steps=min_steps)
  return _with_learning_rate(allocation, budget_rollouts, n_star, law, base)


def _with_learning_rate(allocation, budget, n_star, law, base: RunConfig) -> Prescription:
  optim = base["optim"]
  return Prescription(
      allocation=allocation, budget_rollouts_requested=int(budget), n_star=n_star, law=law,
      learning_rate=float(optim["learning_rate"]),
      lr_reference_batch=int(optim["lr_reference_batch"]),
      lr_scaling=str(optim["lr_scaling"]), run=run_figures(allocation, base))


def to_config(allocation: grids.Allocation, base: RunConfig) -> dict[str, Any]:
  """The base config with the allocation set, as a plain nested dict (not yet validated:
  `config_lib.resolve_dict` checks it, `configs/from_json.py` reads it written as JSON).

  `optim.learning_rate` stays the base (reference-batch) LR: the main loop scales it.
  """
  config = _plain(base)
  config["rollouts_per_problem"] = allocation.rollouts_per_problem
  config["problems_per_batch"] = allocation.problems_per_batch
  config["num_steps"] = allocation.num_steps
  config["budget_rollouts"] = allocation.rollouts
  return config


def _plain(config: RunConfig) -> dict[str, Any]:
  """A nested mapping (a ConfigDict too) as nested plain dicts, copied."""
  return {k: _plain(v) if hasattr(v, "items") else v for k, v in config.items()}


def sweep(budget_rollouts: int, base: RunConfig, *, max_batch_rollouts: int,
          problems_range: Sequence[int], rollouts_range: Sequence[int], min_steps: int = 1,
          exact: bool = True) -> list[grids.Allocation]:
  """The whole iso-compute sweep for C (sorted by (B_p, n)), within the config's limits."""
  return grids.iso_compute_grid(budget_rollouts, max_batch_rollouts,
                                _problems_range(base, problems_range), rollouts_range,
                                min_steps=min_steps, exact=exact)


@dataclasses.dataclass(frozen=True)
class RunFigures:
  """What a run of an allocation derives from its config, as the run derives it."""
  effective_learning_rate: float    # the peak LR (after warm-up), RunSettings.learning_rate
  num_steps: int
  rollouts_per_step: int            # B_p * n sampled
  train_rollouts_per_problem: int   # m (n unless PODS down-samples)
  trained_batch_rollouts: int       # B_p * m: the batch the LR rule scales with

  def to_dict(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def run_figures(allocation: grids.Allocation, base: RunConfig) -> RunFigures:
  """The run's own figures for `allocation` on `base`: `RunSettings` of the config
  `to_config` writes (raises ValueError naming the field when it is not a valid run)."""
  s = run_settings.RunSettings.from_config(to_config(allocation, base))
  return RunFigures(effective_learning_rate=s.learning_rate, num_steps=s.num_steps,
                    rollouts_per_step=s.rollouts_per_step,
                    train_rollouts_per_problem=s.train_rollouts_per_problem,
                    trained_batch_rollouts=s.trained_batch_rollouts)
