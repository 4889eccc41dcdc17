r"""Time-to-target comparison of two recipes: how much compute each needs to reach the
baseline's peak validation score.

  python -m launch.compare --baseline=configs/pods.py:grpo --candidate=configs/pods.py \
      --seeds=0,1,2 --out=/tmp/isojax/pods_vs_grpo -- --config.num_steps=400

For every seed it runs `isojax.main` on both configs (sequentially, so both see the
same machine), then reports, per seed, the baseline's peak `--metric`, and the
rollouts, generated tokens and wall-clock seconds at which each run first reached it.
Extra flags after `--` go to both runs. Finished runs are reused (isojax.main resumes).
Prints a Markdown table and writes `<out>/comparison.json`.
"""

from __future__ import annotations

import os
import subprocess
import sys

from absl import app, flags

from isojax import metrics, run_dir, storage

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined only when it runs as the binary (`launch.reproduce`
  imports this module beside flags of its own)."""
  flags.DEFINE_string("baseline", None, "Baseline config (file.py[:preset]).", required=True)
  flags.DEFINE_string("candidate", None, "Candidate config.", required=True)
  flags.DEFINE_list("seeds", ["0"], "Seeds to run each config with.")
  flags.DEFINE_string("out", None, "Directory for the runs and the report.", required=True)
  flags.DEFINE_string("metric", metrics.val_avg(4), "Metric to compare.")


def first_reaching(lines: list[dict], metric: str, target: float) -> dict | None:
  """The first metrics line whose `metric` is at least `target`, if any."""
  return next((r for r in lines if metric in r and r[metric] >= target), None)


def compare(baseline: list[dict], candidate: list[dict], metric: str) -> dict:
  evaluated = [r for r in baseline if metric in r]
  if not evaluated:
    raise ValueError(f"the baseline run logged no {metric!r}")
  peak = max(evaluated, key=lambda r: r[metric])
  reach = lambda r: None if r is None else {
      k: r[k] for k in (run_dir.STEP, run_dir.ROLLOUTS, run_dir.TOKENS, run_dir.WALL_S)}
  return dict(target=peak[metric],
              baseline=reach(first_reaching(baseline, metric, peak[metric])),
              candidate=reach(first_reaching(candidate, metric, peak[metric])),
              candidate_best=max(r[metric] for r in candidate if metric in r))


def run_config(config: str, workdir: str, seed: str, extra: list[str]) -> list[dict]:
  """`isojax.main` on `config` with `seed` (resuming a finished run is quick); its metrics."""
  cmd = [sys.executable, "-m", "isojax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.seed={seed}", *extra]
  with open(os.path.join(os.path.dirname(workdir), os.path.basename(workdir) + ".log"),
            "w") as log:
    subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
  return run_dir.read_metrics(workdir)


def _cell(point: dict | None) -> str:
  if point is None:
    return "not reached"
  return f"{point['rollouts']:,} rollouts, {point['wall_s']:.0f} s (step {point['step']})"


def main(argv):
  extra = argv[1:]
  os.makedirs(FLAGS.out, exist_ok=True)
  rows = []
  for seed in FLAGS.seeds:
    base = run_config(FLAGS.baseline, os.path.join(FLAGS.out, f"baseline_s{seed}"), seed, extra)
    cand = run_config(FLAGS.candidate, os.path.join(FLAGS.out, f"candidate_s{seed}"), seed,
                      extra)
    rows.append(dict(seed=seed, **compare(base, cand, FLAGS.metric)))
  storage.write_json(os.path.join(FLAGS.out, "comparison.json"),
                     dict(baseline=FLAGS.baseline, candidate=FLAGS.candidate,
                          extra_flags=extra, metric=FLAGS.metric, seeds=rows), indent=2)
  print(markdown_table(rows, FLAGS.metric))


def markdown_table(rows: list[dict], metric: str) -> str:
  """One row per seed: the baseline's peak `metric` and where each run first reached it."""
  lines = [f"| seed | baseline peak {metric} | baseline reaches it | candidate reaches it | "
           "candidate best |", "|---|---|---|---|---|"]
  lines += [f"| {r['seed']} | {r['target']:.4f} | {_cell(r['baseline'])} | "
            f"{_cell(r['candidate'])} | {r['candidate_best']:.4f} |" for r in rows]
  return "\n".join(lines)


if __name__ == "__main__":
  define_flags()
  app.run(main)
