r"""Benchmark: the sweep analysis on 200 synthetic runs x 50 evaluations.

    python -m launch.bench_analyze
    python -m launch.bench_analyze --num_problem_sizes=25 --num_evals=50 --workdir=/tmp/bench

Writes a synthetic sweep (by default 25 batch sizes B_p x 8 values of n = 200
runs, every run its own allocation, so nothing is pooled: the worst case for the
number of fits) and times what `launch.analyze` does: load, fit, frontiers,
checks, analysis.json and the three PNGs; the total is printed beside its target.
"""

from __future__ import annotations

import os
import tempfile
import time

from absl import app
from absl import flags

from isojax.planner import analysis
from isojax.planner import plots
from isojax.planner import synthetic

_NUM_PROBLEM_SIZES = flags.DEFINE_integer("num_problem_sizes", 25, "Distinct B_p values.")
_NUM_EVALS = flags.DEFINE_integer("num_evals", 50, "Evaluations per run.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where the runs go (default: a temp dir).")

_ROLLOUTS = (2, 4, 8, 16, 32, 64, 128, 256)
_BUDGET = 1 << 22


def main(argv):
  del argv
  workdir = _WORKDIR.value or tempfile.mkdtemp(prefix="isojax_bench_")
  problems = [8 + 4 * i for i in range(_NUM_PROBLEM_SIZES.value)]
  curves = synthetic.paper_like_curves(problems, _ROLLOUTS, n_saturation=64,
                                       c_mid_base=_BUDGET / 4000)
  start = time.perf_counter()
  synthetic.write_sweep(workdir, curves, budget_rollouts=_BUDGET, num_evals=_NUM_EVALS.value)
  written = time.perf_counter()

  result = analysis.analyze_directory(workdir)
  analysed = time.perf_counter()
  analysis.write_analysis(result, os.path.join(workdir, analysis.ANALYSIS_FILE))
  plots.write_plots(result, workdir)
  done = time.perf_counter()

  print(f"runs: {len(curves)} x {_NUM_EVALS.value} evaluations in {workdir}")
  print(f"  writing the synthetic runs: {written - start:6.2f} s (not part of the analysis)")
  print(f"  load + fits + frontiers:    {analysed - written:6.2f} s "
        f"({len(result.primary.curve_fits)} allocations, "
        f"{len(result.views)} companion metrics)")
  print(f"  analysis.json + 3 PNGs:     {done - analysed:6.2f} s")
  print(f"  analysis total:             {done - written:6.2f} s (target < 10 s)")


if __name__ == "__main__":
  app.run(main)
