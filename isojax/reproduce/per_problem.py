"""The per_problem section: per-problem rollout allocation (configs/per_problem.py)
against the uniform allocation at the same budget (configs/per_problem.py:uniform).

Fixed before the runs: for each seed both arms run the config's steps (B_p = 16, 128
rollouts a step); the target is each seed's uniform peak `val/avg@4`, and the statistic
the rollouts the per-problem arm needs to first reach it over the uniform arm's, as a
geometric mean over seeds with a 90% interval from a bootstrap over seeds
(`isojax.tools.time_to_target.ratio_effect`); the verdict on "per-problem allocation
reaches it with less compute" is yes when the interval lies below 1, no when wholly
above, inconclusive otherwise. Beside it, each arm's share of groups with a learning
signal (1 - `train/zero_variance_fraction`, averaged over steps), per seed. The uniform
arm is n = 8 only, not the best uniform n of a sweep.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from isojax import metrics, run_dir
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.tools import time_to_target

CONFIG = "configs/per_problem.py"


def signal_share(lines: list[dict]) -> float:
  """Mean over the run's steps of the fraction of groups with reward variance."""
  values = [r[metrics.TRAIN_ZERO_VARIANCE] for r in lines if metrics.TRAIN_ZERO_VARIANCE in r]
  return float(1.0 - np.mean(values))


def run(inv: tables.Invocation, seeds: Sequence[str]) -> str:
  """per_problem.md; returns its path."""
  wall_s, rows = 0.0, []
  for seed in seeds:
    runs = {}
    for arm, config in (("baseline", f"{CONFIG}:uniform"), ("candidate", CONFIG)):
      workdir = os.path.join(inv.out, "per_problem", f"{arm}_s{seed}")
      wall_s += runs_lib.run_main(inv, config, workdir, seed)
      runs[arm] = run_dir.read_metrics(workdir)
    rows.append(dict(seed=seed, signal={arm: signal_share(lines) for arm, lines in runs.items()},
                     **time_to_target.compare(runs["baseline"], runs["candidate"],
                                              metrics.val_avg(4))))
  body = "\n".join([
      "Per-problem allocation (`configs/per_problem.py`: each step's 16 x 8 = 128 rollouts "
      "split among its 16 problems by their estimated pass rates, 2 to 32 each) against "
      "the uniform allocation at the same budget (`configs/per_problem.py:uniform`: 8 "
      "each), on 2- and 3-digit additions, the config's 100 steps, one run per seed and "
      "arm. The target is each seed's uniform peak `val/avg@4`; the cells give where each "
      "run first reached it. The uniform arm is n = 8 only, not the best uniform n of a "
      "sweep.", "",
      time_to_target.markdown_table(rows, metrics.val_avg(4)), "", verdict_table(rows), ""])
  return tables.write(inv, "per_problem.md", "Per-problem allocation against uniform",
                      wall_s, body)


def verdict_table(rows) -> str:
  """The claim on the seeds' rollouts ratio, and each arm's share of groups with a signal."""
  effect = time_to_target.ratio_effect(rows, run_dir.ROLLOUTS)
  censored = (f"; seed(s) {', '.join(map(str, effect['censored']))}: per-problem never "
              "reached the target, counted at the run's end (a lower bound)"
              if effect["censored"] else "")
  share = lambda arm: ", ".join(f"{r['signal'][arm]:.2f}" for r in rows)
  return "\n".join([
      "| claim | per-problem / uniform rollouts to the uniform peak, geometric mean over "
      "seeds [90% CI] | verdict | groups with a signal, per seed: uniform | per-problem |",
      "|---|---|---|---|---|",
      f"| per-problem allocation reaches the uniform peak with less compute | "
      f"{effect['value']:.2f}x [{effect['lo']:.2f}, {effect['hi']:.2f}]{censored} | "
      f"**{time_to_target.speedup_verdict(effect, 1.0)}** | {share('baseline')} | "
      f"{share('candidate')} |"])
