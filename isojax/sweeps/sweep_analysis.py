"""A sweep's analysis: for each metric (and variant) the fits, frontier and n*(C) law
(`isojax.planner.analysis`, the library behind `launch.analyze`), then the experiment of
the sweep's kind with each effect's bootstrap interval (`isojax.planner.experiments`)."""

from __future__ import annotations

import math
import os
from typing import Any
import zlib

import ml_collections
from absl import logging

from isojax import run_dir, storage
from isojax.planner import analysis, experiments, findings, plots
from isojax.sweeps.layout import RUNS_DIR
from isojax.sweeps.sweep_config import with_defaults


def metric_dir(out_dir: str, metric: str, primary: str) -> str:
  """DIR for the primary metric, DIR/<metric without 'val/'> for the others."""
  if metric == primary:
    return out_dir
  return os.path.join(out_dir, metric.split("/", 1)[-1])


def _analyze_metrics(runs_dir: str, target_dir: str, sweep: ml_collections.ConfigDict,
                     label: str = "") -> dict[str, dict[str, Any]]:
  metrics_list = list(sweep.analysis.metrics)
  primary = metrics_list[0]
  summary = {}
  for metric in metrics_list:
    options = analysis.Options(
        metric=metric, use_records=bool(sweep.analysis.records),
        fit_min_rollouts=float(sweep.analysis.fit_min_rollouts),
        companions=metric == primary)  # the primary's views already hold the companions
    result = analysis.analyze_directory(runs_dir, options)
    target = metric_dir(target_dir, metric, primary)
    written = analysis.write_analysis(result, os.path.join(target, analysis.ANALYSIS_FILE))
    plots.write_plots(result, target)
    end = written["frontier"][-1] if written["frontier"] else None
    summary[f"{label}/{metric}" if label else metric] = dict(
        dir=target, n_star_fit=written["n_star_fit"], frontier_end=end)
  return summary


def analyze(out_dir: str, sweep: ml_collections.ConfigDict) -> dict[str, Any]:
  """analysis.json and plots for each metric of `sweep.analysis.metrics` (per variant:
  DIR/<variant>/), then the experiment of the sweep's kind: DIR/experiment.json with
  each effect's bootstrap interval, and DIR/experiment.png.

  Returns {"metrics": {metric or variant/metric: {"dir", "n_star_fit",
  "frontier_end"}}, "experiment": {"path", "effects"} or {"error"}}; raises
  analysis.AnalysisError when the runs cannot be analysed.
  """
  sweep = with_defaults(sweep)
  runs_dir = os.path.join(out_dir, RUNS_DIR)
  variants = list(sweep.variants)
  summary: dict[str, Any] = {"metrics": {}}
  for variant, runs in experiments.variant_dirs(runs_dir, variants).items():
    summary["metrics"].update(_analyze_metrics(
        runs, os.path.join(out_dir, variant) if variant else out_dir, sweep, variant))
  try:
    # Each sweep draws its own replicates (seeded by its name): findings that subtract two
    # sweeps' replicates (claim 2c) need independent draws, not the same draw twice.
    result = experiments.analyze_experiment(
        runs_dir, sweep.kind, variants, metric=list(sweep.analysis.metrics)[0],
        num_resamples=sweep.bootstrap_resamples, seed=zlib.crc32(sweep.name.encode()))
  except (analysis.AnalysisError, run_dir.RunFormatError) as e:
    logging.error("experiment analysis of %s failed: %s", out_dir, e)
    summary["experiment"] = {"error": str(e)}
    return summary
  result["difficulty"] = sweep.difficulty
  findings.record_look(out_dir, analysis.json_safe(result))
  path = os.path.join(out_dir, experiments.EXPERIMENT_FILE)
  storage.write_json(path, analysis.json_safe(result), indent=1, sort_keys=True,
                     allow_nan=False)
  plots.plot_experiment(result, os.path.join(out_dir, plots.EXPERIMENT))
  summary["experiment"] = {"path": path, "effects": {
      k: {f: e[f] for f in ("value", "lo", "hi")} for k, e in result["effects"].items()}}
  return summary


def format_analysis(summary: dict[str, Any]) -> str:
  """One line per metric: where its analysis is, the frontier's end, the n*(C) law;
  then the experiment's effects with their intervals."""
  lines = []
  for metric, s in summary["metrics"].items():
    line = f"{metric}: {os.path.join(s['dir'], analysis.ANALYSIS_FILE)}"
    end = s["frontier_end"]
    if end:
      line += (f"; best at C={end['rollouts']:.6g}: B_p={end['problems_per_batch']}, "
               f"n={end['rollouts_per_problem']} ({end['value']:.4f})")
    law = s["n_star_fit"]
    if law and law.get("n_saturation") is not None and math.isfinite(law["n_saturation"]):
      line += f"; fitted n*(C) from n={law['n_low']:.3g} to n={law['n_saturation']:.3g}"
      if law.get("censored"):
        line += " (the frontier ends at the largest n swept)"
    lines.append(line)
  exp = summary.get("experiment", {})
  if "error" in exp:
    lines.append(f"experiment: failed ({exp['error']})")
  elif exp:
    lines.append(f"experiment: {exp['path']}")
    lines += [f"  {name} = {e['value']:+.4f} [{e['lo']:+.4f}, {e['hi']:+.4f}]"
              for name, e in exp["effects"].items()]
  return "\n".join(lines)
