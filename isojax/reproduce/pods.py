"""The pods section: PODS (configs/pods.py) against vanilla GRPO (configs/pods.py:grpo).

For each seed both arms run the same number of steps; the table says where each first
reached the seed's GRPO peak `val/avg@4` (`isojax.compare`, as `launch.compare` does).
"""

from __future__ import annotations

import os
from typing import Sequence

from isojax import compare, metrics, run_dir
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
    rows.append(dict(seed=seed, **compare.compare(runs["baseline"], runs["candidate"],
                                                   metrics.val_avg(4))))
  body = "\n".join([
      f"PODS (n = 16 generated, m = 4 trained per problem; `configs/pods.py`) against "
      f"vanilla GRPO (n = m = 4; `configs/pods.py:grpo`) on the hard default, {steps} "
      "steps, evaluation every 20. The target is each seed's GRPO peak `val/avg@4`; "
      "the cells give where each run first reached it (`launch.compare`).", "",
      compare.markdown_table(rows, metrics.val_avg(4)), ""])
  return tables.write(inv, "pods.md", "PODS against vanilla GRPO", wall_s, body)
