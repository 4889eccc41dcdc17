"""The isa section: configs/hard.py (seed 0) under each XLA:CPU instruction-set cap.

Where each run departs from the AVX2 run (the default cap of every isojax command) and
its wall time: a cap below the host's makes this machine compile what a machine of that
level compiles, so the table shows what a result owes to the instruction set.
"""

from __future__ import annotations

import os
from typing import Any

from isojax import cpu_isa, metrics, run_dir
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

# XLA:CPU instruction-set caps the section compares (`cpu_isa`): native is none.
ISA_CAPS = (cpu_isa.NATIVE, "AVX2", "AVX", "SSE4_2")


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]],
                     prefix: str = "") -> int | None:
  """The first step whose metrics (those starting with `prefix`; timings aside) differ
  between two runs' lines, None if none does."""
  pick = lambda r: {k: v for k, v in run_dir.without_timings(r).items()
                    if k.startswith(prefix)}
  for line_a, line_b in zip(a, b):
    if pick(line_a) != pick(line_b):
      return line_a[run_dir.STEP]
  return None if len(a) == len(b) else min(len(a), len(b))


def table(runs: dict[str, list[dict[str, Any]]], summaries: dict[str, dict[str, Any]],
          reference: str = "AVX2") -> str:
  """Markdown: per cap, step-0 and final val/avg@4, where it departs from `reference`."""
  avg, se = metrics.val_avg(4), metrics.val_avg(4) + "_stderr"
  lines = [f"| XLA:CPU cap | step-0 `val/avg@4` | final `val/avg@4` | gain / SE | first step "
           f"whose metrics differ from {reference}'s | first evaluation that differs | "
           "wall time |", "|---|---|---|---|---|---|---|"]
  show = lambda step: "none" if step is None else str(step)
  for cap, lines_ in runs.items():
    s = summaries[cap]
    lines.append(f"| {cap} | {s['initial'][avg]:.3f} +- {s['initial'][se]:.3f} | "
                 f"{s['final'][avg]:.3f} +- {s['final'][se]:.3f} | {runs_lib.gain_in_se(s)} | "
                 f"{show(first_difference(lines_, runs[reference]))} | "
                 f"{show(first_difference(lines_, runs[reference], metrics.VAL_PREFIX))} | "
                 f"{tables.format_seconds(s['wall_s'])} |")
  return "\n".join(lines)


def run(inv: tables.Invocation) -> str:
  """isa.md; returns its path."""
  wall_s, runs, summaries = 0.0, {}, {}
  for cap in ISA_CAPS:
    workdir = os.path.join(inv.out, "isa", cap)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env[cpu_isa.ENV] = cap
    wall_s += runs_lib.run_main(inv, "configs/hard.py", workdir, "0", env=env)
    runs[cap], summaries[cap] = run_dir.read_metrics(workdir), runs_lib.summarize_run(workdir)
  body = "\n".join([
      "`configs/hard.py`, seed 0, from the shipped base model, once under each XLA:CPU "
      f"instruction-set cap (`{cpu_isa.ENV}`; AVX2 is the default of every isojax "
      "command, native means no cap). A cap below the host's makes this machine compile "
      "what a machine of that level compiles. A run that departs from the AVX2 run "
      "samples other tokens from then on; its gain is then another draw of the same "
      "experiment.", "", table(runs, summaries), ""])
  return tables.write(inv, "isa.md", "XLA:CPU instruction sets: what the cap changes",
                      wall_s, body)
