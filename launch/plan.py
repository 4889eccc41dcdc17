r"""Prescribe (n, B_p, M) and the learning rate for a sampling budget, as configs.

    # From a fitted sweep:
    python -m launch.plan --budget_rollouts=262144 --analysis=/tmp/sweep/analysis.json \
        --config=configs/hard.py
    # No sweep yet: the paper-derived default law (hard or easy, from the recipe):
    python -m launch.plan --budget_rollouts=262144 --config=configs/easy.py
    # The whole iso-compute sweep for the budget, one config per allocation:
    python -m launch.plan --budget_rollouts=262144 --config=configs/hard.py --grid

Prints the prescription (or, with --grid, the manifest) as JSON on stdout and writes
nothing unless asked: with --out=DIR the resolved config(s) go there as JSON
(DIR/plan_C<budget>.json, or DIR/grid_C<budget>/ with one file per allocation and its
manifest), and the printed JSON names them. Run a written config with

    python -m isojax.main --config=configs/from_json.py:DIR/plan_C262144.json

The config keeps `optim.learning_rate` at the reference batch
(`optim.lr_reference_batch`); the run applies the batch-size rule (`optim.lr_scaling`,
square root in the recipes) to the batch it trains on, B_p * m (PODS trains on m of
the n rollouts). The printed JSON reports what the run derives, read from the run's own
settings (`RunSettings`): `effective_learning_rate` (the peak LR), `num_steps`,
`rollouts_per_step`, `train_rollouts_per_problem` and `trained_batch_rollouts`.
Output is deterministic.
"""

from __future__ import annotations

import json
import os

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from isojax import command_line
from isojax import storage
from isojax.config import config_lib
from isojax.planner import grids
from isojax.planner import prescribe

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Base config file (configs/*.py, `:arg` allowed); its allocation is "
    "replaced by the prescription. Default: config_lib.base_config().", lock_config=False)
_BUDGET = flags.DEFINE_integer("budget_rollouts", None, "Sampling budget C in rollouts.",
                               required=True)
_ANALYSIS = flags.DEFINE_string("analysis", None, "analysis.json of launch.analyze; its "
                                "n_star_fit sets n. Without it, a paper-derived default law.")
_DIFFICULTY = flags.DEFINE_enum("difficulty", None, sorted(prescribe.PAPER_DEFAULTS),
                                "Which default law without --analysis (default: 'easy' if "
                                "the config uses the KL anchor of the easy recipe, else 'hard').")
_MAX_BATCH = flags.DEFINE_integer("max_batch_rollouts", 1024, "B_max: the largest rollout "
                                  "batch B_p * n the hardware takes (paper: 16384 hard, "
                                  "65536 easy).")
_MIN_PROBLEMS = flags.DEFINE_integer("min_problems_per_batch", 8, "Smallest B_p.")
_MAX_PROBLEMS = flags.DEFINE_integer("max_problems_per_batch", 1024,
                                     "Largest B_p (also capped by task.num_train).")
_MIN_ROLLOUTS = flags.DEFINE_integer("min_rollouts_per_problem", 2, "Smallest n.")
_MAX_ROLLOUTS = flags.DEFINE_integer("max_rollouts_per_problem", 2048, "Largest n.")
_MIN_STEPS = flags.DEFINE_integer("min_steps", 10, "Fewest update iterations M an "
                                  "allocation may have (10 = the LR warm-up).")
_GRID = flags.DEFINE_bool("grid", False, "Emit the whole iso-compute sweep for the budget.")
_EXACT = flags.DEFINE_bool("exact_budget", True, "--grid: only allocations with "
                           "B_p * n * M == C exactly; --noexact_budget floors M instead.")
_OUT = flags.DEFINE_string("out", None, "Directory (local or gs://) the config(s) are "
                           "written to; unset: nothing is written.")
_TOKENS_PER_ROLLOUT = flags.DEFINE_float("tokens_per_rollout", None, "Mean response "
                                         "length, to report the budget in tokens.")
_THROUGHPUT = flags.DEFINE_float("tokens_per_accelerator_second", None, "Measured "
                                 "throughput, to report accelerator-hours (needs "
                                 "--tokens_per_rollout).")


def _base_config():
  return _CONFIG.value if _CONFIG.value is not None else config_lib.base_config()


def _cost(rollouts: int) -> dict[str, float]:
  """Tokens and accelerator-hours of a budget, when the flags give the figures."""
  out = {}
  if _TOKENS_PER_ROLLOUT.value:
    out["tokens"] = grids.tokens(rollouts, _TOKENS_PER_ROLLOUT.value)
    if _THROUGHPUT.value:
      out["accelerator_hours"] = grids.accelerator_hours(
          rollouts, _TOKENS_PER_ROLLOUT.value, _THROUGHPUT.value)
  return out


def _law(base):
  if _ANALYSIS.value:
    return prescribe.load_law(_ANALYSIS.value)
  difficulty = _DIFFICULTY.value or prescribe.difficulty_of(base)
  logging.info("no --analysis: using the paper-derived default law for %s problems",
               difficulty)
  return prescribe.default_law(difficulty, _MAX_BATCH.value)


def _plan(base, out_dir: str | None):
  """The prescription (or the grid's manifest); configs written under `out_dir` if set."""
  ranges = dict(max_batch_rollouts=_MAX_BATCH.value,
                problems_range=(_MIN_PROBLEMS.value, _MAX_PROBLEMS.value),
                rollouts_range=(_MIN_ROLLOUTS.value, _MAX_ROLLOUTS.value),
                min_steps=_MIN_STEPS.value)
  budget = _BUDGET.value
  if _GRID.value:
    grid_dir = out_dir and os.path.join(out_dir, f"grid_C{budget}")
    entries = []
    allocations = prescribe.sweep(budget, base, exact=_EXACT.value, **ranges)
    if _EXACT.value:
      floored = prescribe.sweep(budget, base, exact=False, **ranges)
      if len(floored) > len(allocations):
        logging.warning("only %d of %d allocations divide budget_rollouts=%d exactly; use a "
                        "multiple of a larger power of two or --noexact_budget",
                        len(allocations), len(floored), budget)
    for a in allocations:
      entry = {**a.to_dict(), **prescribe.run_figures(a, base).to_dict(), **_cost(a.rollouts)}
      if grid_dir:
        entry["config_path"] = os.path.join(
            grid_dir, f"bp{a.problems_per_batch}_n{a.rollouts_per_problem}_m{a.num_steps}.json")
        storage.write_json(entry["config_path"],
                           config_lib.resolve_dict(prescribe.to_config(a, base)), indent=2,
                           sort_keys=True)
      entries.append(entry)
    manifest = {"budget_rollouts": budget, "max_batch_rollouts": _MAX_BATCH.value,
                "allocations": entries}
    if grid_dir:
      storage.write_json(os.path.join(grid_dir, "manifest.json"), manifest, indent=2,
                         sort_keys=True)
    return manifest
  result = prescribe.prescribe(budget, _law(base), base, **ranges)
  output = {**result.to_dict(), **_cost(result.allocation.rollouts)}
  if out_dir:
    output["config_path"] = os.path.join(out_dir, f"plan_C{budget}.json")
    storage.write_json(output["config_path"],
                       config_lib.resolve_dict(prescribe.to_config(result.allocation, base)),
                       indent=2, sort_keys=True)
  return output


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _BUDGET.value <= 0:
    raise app.UsageError(f"--budget_rollouts={_BUDGET.value}: expected a positive integer")
  try:
    output = _plan(_base_config(), _OUT.value)
  except ValueError as e:  # BudgetTooSmallError, bad analysis file, resolve() errors
    raise SystemExit(f"launch.plan: error: {e}") from None
  print(json.dumps(output, indent=2, sort_keys=True))


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.parse_flags)
