r"""Reproduces the planner figure, docs/img/planner_metric_vs_compute.png, from a synthetic sweep.

    python -m launch.demo_analysis
    python -m launch.demo_analysis --runs=/tmp/isojax_demo \
        --image=docs/img/planner_metric_vs_compute.png

Writes a sweep of 14 runs (B_p in {16, 64} x n in {2, ..., 128}, 40 log-spaced
evaluations, noise sd 0.01) whose true curves follow the paper's shape (`synthetic.
paper_like_curves`: n* rises with compute and saturates at n = 32), runs the same
analysis as `python -m launch.analyze --runs=...` (analysis.json and all PNGs go
into --runs), and copies its metric-vs-compute figure to --image.
"""

from __future__ import annotations

import os
import shutil

from absl import app
from absl import flags

from isojax.planner import analysis
from isojax.planner import plots
from isojax.planner import synthetic

_RUNS = flags.DEFINE_string("runs", "/tmp/isojax_planner_demo", "Where the synthetic runs "
                            "and the analysis go (replaced if it exists).")
_IMAGE = flags.DEFINE_string("image", "docs/img/planner_metric_vs_compute.png",
                             "Where the planner figure is written.")


def main(argv):
  del argv
  if os.path.isdir(_RUNS.value):
    shutil.rmtree(_RUNS.value)
  synthetic.write_demo_sweep(_RUNS.value)
  result = analysis.analyze_directory(_RUNS.value)
  analysis.write_analysis(result, os.path.join(_RUNS.value, analysis.ANALYSIS_FILE))
  paths = plots.write_plots(result, _RUNS.value)
  os.makedirs(os.path.dirname(_IMAGE.value) or ".", exist_ok=True)
  shutil.copyfile(paths[0], _IMAGE.value)
  law = result.primary.law
  print(f"n*(C) saturates at n = {2 ** law.log2_n_high:.3g} "
        f"(true: {synthetic.DEMO_N_SATURATION}); "
        f"analysis in {_RUNS.value}; figure at {_IMAGE.value}")


if __name__ == "__main__":
  app.run(main)
