"""Time-to-target comparison of two recipes: how much compute each run needs to reach the
baseline's peak validation score.

The library behind `launch.compare` and the pods section of `launch.reproduce`: given
the metrics lines of a baseline run and a candidate run, the baseline's peak of a
metric, and the rollouts, generated tokens and wall-clock seconds at which each run
first reached it.
"""

from __future__ import annotations

import os
import subprocess
import sys

from isojax import run_dir


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


def markdown_table(rows: list[dict], metric: str) -> str:
  """One row per seed: the baseline's peak `metric` and where each run first reached it."""
  lines = [f"| seed | baseline peak {metric} | baseline reaches it | candidate reaches it | "
           "candidate best |", "|---|---|---|---|---|"]
  lines += [f"| {r['seed']} | {r['target']:.4f} | {_cell(r['baseline'])} | "
            f"{_cell(r['candidate'])} | {r['candidate_best']:.4f} |" for r in rows]
  return "\n".join(lines)
