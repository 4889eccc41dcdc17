r"""Time-to-target comparison of two recipes: how much compute each needs to reach the
baseline's peak validation score.

  python -m launch.compare --baseline=configs/pods.py:grpo --candidate=configs/pods.py \
      --seeds=0,1,2 --out=/tmp/isojax/pods_vs_grpo -- --config.num_steps=400

For every seed it runs `isojax.main` on both configs (sequentially, so both see the
same machine), then reports, per seed, the baseline's peak `--metric`, and the
rollouts, generated tokens and wall-clock seconds at which each run first reached it.
Extra flags after `--` go to both runs. Finished runs are reused (isojax.main resumes).
Prints a Markdown table and writes `<out>/comparison.json`. The library is
`isojax.tools.time_to_target`.
"""

from __future__ import annotations

import os

from absl import app, flags

from isojax import metrics, storage
from isojax.tools import time_to_target

_BASELINE = flags.DEFINE_string("baseline", None, "Baseline config (file.py[:preset]).",
                                required=True)
_CANDIDATE = flags.DEFINE_string("candidate", None, "Candidate config.", required=True)
_SEEDS = flags.DEFINE_list("seeds", ["0"], "Seeds to run each config with.")
_OUT = flags.DEFINE_string("out", None, "Directory for the runs and the report.",
                           required=True)
_METRIC = flags.DEFINE_string("metric", metrics.val_avg(4), "Metric to compare.")


def main(argv):
  extra = argv[1:]
  os.makedirs(_OUT.value, exist_ok=True)
  rows = []
  for seed in _SEEDS.value:
    base = time_to_target.run_config(_BASELINE.value, os.path.join(_OUT.value, f"baseline_s{seed}"),
                              seed, extra)
    cand = time_to_target.run_config(_CANDIDATE.value, os.path.join(_OUT.value, f"candidate_s{seed}"),
                              seed, extra)
    rows.append(dict(seed=seed, **time_to_target.compare(base, cand, _METRIC.value)))
  storage.write_json(os.path.join(_OUT.value, "comparison.json"),
                     dict(baseline=_BASELINE.value, candidate=_CANDIDATE.value,
                          extra_flags=extra, metric=_METRIC.value, seeds=rows), indent=2)
  print(time_to_target.markdown_table(rows, _METRIC.value))


if __name__ == "__main__":
  app.run(main)
