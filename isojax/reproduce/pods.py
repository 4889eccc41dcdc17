"""The pods section: PODS (configs/pods.py) against vanilla GRPO (configs/pods.py:grpo).

For each seed both arms run the same number of steps; the table says where each first
reached the seed's GRPO peak `val/avg@4` (`isojax.tools.time_to_target`, as `launch.compare` does),
and a verdict row tests PODS's headline (GRPO's peak reached at least 1.7x faster) on the
wall-clock ratio over seeds, beside the rollouts ratio and the regime the premise needs:
an update far dearer than sampling, so that training on m of n rollouts saves time.
"""

from __future__ import annotations

import os
from typing import Sequence

from isojax import metrics, run_dir
from isojax.tools import time_to_target

HEADLINE_SPEEDUP = 1.7   # PODS: GRPO's peak reached at least 1.7x faster
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables


def run(inv: tables.Invocation, seeds: Sequence[str], steps: int) -> str:
  """pods.md; returns its path."""
  wall_s = 0.0
  extra = [f"--config.num_steps={steps}", "--config.eval.every=20"]
  rows = []
  for seed in seeds:
    runs = {}
    for arm, config in (("baseline", "configs/pods.py:grpo"), ("candidate", "configs/pods.py")):
      workdir = os.path.join(inv.out, "pods", f"{arm}_s{seed}")
      wall_s += runs_lib.run_main(inv, config, workdir, seed, extra)
      runs[arm] = run_dir.read_metrics(workdir)
    rows.append(dict(seed=seed, **time_to_target.compare(runs["baseline"], runs["candidate"],
                                                   metrics.val_avg(4))))
  body = "\n".join([
      f"PODS (n = 16 generated, m = 4 trained per problem; `configs/pods.py`) against "
      f"vanilla GRPO (n = m = 4; `configs/pods.py:grpo`) on the hard default, {steps} "
      "steps, evaluation every 20. The target is each seed's GRPO peak `val/avg@4`; "
      "the cells give where each run first reached it (`launch.compare`).", "",
      time_to_target.markdown_table(rows, metrics.val_avg(4)), "", verdict_table(rows), ""])
  return tables.write(inv, "pods.md", "PODS against vanilla GRPO", wall_s, body)


def verdict_table(rows) -> str:
  """PODS's headline tested on the seeds' wall-clock ratio, the rollouts ratio beside it,
  and the measured seconds per step of sampling and of the update in each arm."""
  wall, rollouts = (time_to_target.ratio_effect(rows, key) for key in (run_dir.WALL_S,
                                                              run_dir.ROLLOUTS))
  phases = {k: sum(r["phase_s"][k] for r in rows) / len(rows) for k in rows[0]["phase_s"]}
  censored = (f"; seed(s) {', '.join(map(str, wall['censored']))}: PODS never reached the "
              "peak, counted at the run's end (a lower bound)" if wall["censored"] else "")
  ratio = lambda e: f"{e['value']:.2f}x [{e['lo']:.2f}, {e['hi']:.2f}]"
  return "\n".join([
      "| claim | measured | PODS / GRPO to GRPO's peak, geometric mean over seeds [90% CI] "
      "| verdict | regime |", "|---|---|---|---|---|",
      f"| PODS reaches GRPO's peak at least {HEADLINE_SPEEDUP}x faster (wall clock) | "
      f"wall seconds | {ratio(wall)} | **{time_to_target.speedup_verdict(wall, HEADLINE_SPEEDUP)}** | "
      f"per step: GRPO samples {phases['baseline_sample_s']:.3f} s, updates "
      f"{phases['baseline_update_s']:.3f} s; PODS samples {phases['candidate_sample_s']:.3f} "
      f"s, updates {phases['candidate_update_s']:.3f} s. The premise needs an update far "
      f"dearer than sampling{censored} |",
      f"| (beside it) | rollouts | {ratio(rollouts)} | | |"])
