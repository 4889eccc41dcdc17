"""The demos section: each demo config as shipped, from its shipped base model, per seed.

`table` and `plot` also serve the sections that run other presets the same way
(`algorithms`, `smollm2`): a row per (preset, seed) with the step-0 and final
`val/avg@4`, the gain and its paired standard error, best@4 / worst@4 and the wall time,
then the training-set pass@1 histograms.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from isojax import metrics
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

# (name, config): the demos every user runs first.
DEMOS = (("hard", "configs/hard.py"), ("easy", "configs/easy.py"),
         ("reasoning", "configs/reasoning.py"))


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
  """Markdown: a row per (demo, seed) of `summarize_run` results, then the histograms."""
  avg, se = metrics.val_avg(4), metrics.val_avg(4) + "_stderr"
  lines = ["| demo | seed | step-0 `val/avg@4` | final `val/avg@4` | gain | gain / SE | "
           "best@4 | worst@4 | steps | wall time |", "|---|---|---|---|---|---|---|---|---|---|"]
  for name, rows in runs.items():
    for r in rows:
      i, f = r["initial"], r["final"]
      lines.append(
          f"| {name} | {r['seed']} | {i[avg]:.3f} +- {i[se]:.3f} | {f[avg]:.3f} +- "
          f"{f[se]:.3f} | {r['gain']:+.3f} | {runs_lib.gain_in_se(r)} | "
          f"{i['val/best@4']:.3f} -> {f['val/best@4']:.3f} | "
          f"{i['val/worst@4']:.3f} -> {f['val/worst@4']:.3f} | {r['steps']} | "
          f"{tables.format_seconds(r['wall_s'])} |")
  lines += ["", "Training-set pass@1 histograms (`train/pass@1_histogram`: problems with "
            "0, 1, ..., N of N samples correct):", "",
            "| demo | seed | step 0 | final |", "|---|---|---|---|"]
  for name, rows in runs.items():
    for r in rows:
      lines.append(f"| {name} | {r['seed']} | `{r['initial'][metrics.TRAIN_PASS1_HISTOGRAM]}` "
                   f"| `{r['final'][metrics.TRAIN_PASS1_HISTOGRAM]}` |")
  return "\n".join(lines)


def plot(runs: dict[str, list[dict[str, Any]]], path: str) -> None:
  """`val/avg@4` against the update step, one panel per demo, one line per seed."""
  fig, axes = tables.figure((4.2 * len(runs), 3.2), nrows=1, ncols=len(runs), squeeze=False)
  for ax, (name, rows) in zip(axes[0], runs.items()):
    for r in rows:
      steps, values = zip(*r["curve"])
      ax.plot(steps, values, marker=".", label=f"seed {r['seed']}")
    ax.set(title=name, xlabel="update step", ylabel="val/avg@4")
    ax.legend(fontsize=8)
  tables.save_figure(fig, path)


def run(inv: tables.Invocation, seeds: Sequence[str]) -> str:
  """demos.md and img/demos.png; returns the table's path."""
  wall_s, runs = runs_lib.run_presets(inv, "demos", DEMOS, seeds)
  plot(runs, os.path.join(inv.results, "img", "demos.png"))
  body = "\n".join([
      "Each demo's config as shipped, from its shipped base model, one run per RL seed "
      "(`--config.seed`). `+-` is the standard error of one evaluation over the 256 "
      "validation problems; gain / SE divides the gain by its standard error paired over "
      "those problems. Wall time includes start-up and compilation.", "",
      table(runs), "", "![val/avg@4 per step](img/demos.png)", ""])
  return tables.write(inv, "demos.md", "The demos: RL from the shipped base models", wall_s,
                      body)
