r"""Analyse a sweep: fits, the frontier, n*(C) and its law, as JSON and PNG plots.

    python -m launch.analyze --runs=/tmp/sweep
    python -m launch.analyze --runs=/tmp/sweep --metric=val/best@4 --out_dir=/tmp/best

Reads every run directory under --runs (`config.json` + `metrics.jsonl`, the
layout of `isojax.run_dir`), skips broken runs with a warning that names them,
and writes `analysis.json` plus metric_vs_compute.png, n_star.png and views.png
into --out_dir (default: --runs). The JSON schema is documented in
docs/planner.md; `launch.plan --analysis=.../analysis.json` consumes it.
"""

from __future__ import annotations

import os
import time

from absl import app
from absl import flags
from absl import logging

from isojax import metrics
from isojax.planner import analysis
from isojax.planner import plots
from isojax.planner import records

_RUNS = flags.DEFINE_string("runs", None, "Directory holding the sweep's run directories "
                            "(searched recursively).", required=True)
_METRIC = flags.DEFINE_string("metric", metrics.val_avg(4),
                              "Metric to fit against compute, e.g. val/avg@4, val/best@4, "
                              "val/worst@4.")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Where analysis.json and the PNGs go "
                               "(default: --runs).")
_BIN_WIDTH = flags.DEFINE_float("bin_width", records.DEFAULT_BIN_WIDTH,
                                "Bin width (metric units) of the record-breaking points.")
_RECORDS = flags.DEFINE_bool("records", False, "Fit only the record-breaking points (the "
                             "IsoCompute paper's literal workflow; biases A up by the noise) instead "
                             "of every evaluation.")
_FIT_MIN_ROLLOUTS = flags.DEFINE_float("fit_min_rollouts", 0.0,
                                       "Ignore evaluations before this compute in the fits.")
_FRACTION = flags.DEFINE_float("extrapolation_fraction", 0.5, "The extrapolation check fits "
                               "on compute <= fraction * C_max and predicts C_max.")
_GRID_POINTS = flags.DEFINE_integer("grid_points", 64, "Log-spaced compute values on which "
                                    "the frontier is evaluated.")
_PLOTS = flags.DEFINE_bool("plots", True, "Write the PNG figures.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  start = time.perf_counter()
  options = analysis.Options(
      metric=_METRIC.value, bin_width=_BIN_WIDTH.value, use_records=_RECORDS.value,
      grid_points=_GRID_POINTS.value, extrapolation_fraction=_FRACTION.value,
      fit_min_rollouts=_FIT_MIN_ROLLOUTS.value)
  try:
    result = analysis.analyze_directory(_RUNS.value, options)
  except analysis.AnalysisError as e:
    raise SystemExit(f"launch.analyze: error: {e}") from None
  out_dir = _OUT_DIR.value or _RUNS.value
  json_path = os.path.join(out_dir, analysis.ANALYSIS_FILE)
  written = analysis.write_analysis(result, json_path)
  outputs = [json_path]
  if _PLOTS.value:
    outputs += plots.write_plots(result, out_dir)
  law = written["n_star_fit"]
  # Each skipped run was already logged by name as a warning.
  summary = (f"{written['num_runs']} runs ({len(result.skipped)} skipped), "
             f"{len(written['fits'])} fitted allocations")
  if law:
    summary += (f"; n*(C) rises from {law['n_low']:.3g} to saturate at n = "
                f"{law['n_saturation']:.3g} (90% by C = {law['saturation_compute']:.3g})")
  logging.info("%s in %.2f s", summary, time.perf_counter() - start)
  print(summary)
  for path in outputs:
    print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
