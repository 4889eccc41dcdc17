"""Time-to-target comparison of two recipes: how much compute each run needs to reach the
baseline's peak validation score.

The library behind `launch.compare` and the pods section of `launch.reproduce`: given
the metrics lines of a baseline run and a candidate run, the baseline's peak of a
metric, and the rollouts, generated tokens and wall-clock seconds at which each run
first reached it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from typing import Any, Sequence

import numpy as np
from scipy import stats

from isojax import run_dir
from isojax.planner import bootstrap


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
              candidate_best=max(r[metric] for r in candidate if metric in r),
              candidate_end=reach(candidate[-1]),
              phase_s=_phase_seconds(baseline, candidate))


def _phase_seconds(baseline: list[dict], candidate: list[dict]) -> dict[str, float]:
  """Mean sampling and update seconds per step of each run (`time/sample_s`,
  `time/update_s`): the regime a recipe that samples more to train on less needs."""
  out = {}
  for arm, lines in (("baseline", baseline), ("candidate", candidate)):
    for phase in ("sample_s", "update_s"):
      values = [r[f"time/{phase}"] for r in lines if f"time/{phase}" in r]
      out[f"{arm}_{phase}"] = float(np.mean(values)) if values else float("nan")
  return out


def ratio_effect(rows: Sequence[dict], key: str, *,
                 level: float = bootstrap.DEFAULT_LEVEL) -> dict[str, Any]:
  """The candidate's `key` (rollouts or wall_s) to reach the target over the baseline's,
  across seeds: the geometric mean of the per-seed ratios and its `level` (90%) interval,
  Student's t on the seeds' log ratios (mean +- t_{k-1} SD / sqrt(k)). A seed whose
  candidate never reached the target counts with its run's end (a lower bound on its
  ratio) and is listed in `censored`. A seed whose baseline peaks at 0 is refused (no
  ratio exists).

  Not a bootstrap over seeds: with 3 to 5 seeds a percentile bootstrap's interval is
  too narrow. On synthetic seeds with no true saving (`isojax.tools.target_calibration`,
  5 seeds) it decided (yes or no) in 12% of testbeds at a nominal 3.3%, measured on
  this function as of 6277d6e; the t interval in 1-6% (docs/results/calibration.md)."""
  log_r, censored = [], []
  for row in rows:
    base, cand = row["baseline"], row["candidate"]
    if not base[key]:
      raise ValueError(f"seed {row['seed']}: the baseline's peak is its first evaluation "
                       f"({key} 0), so it never beat its start and there is no time to a "
                       "target to compare; expected a baseline that improves")
    if cand is None:
      cand = row["candidate_end"]
      censored.append(row["seed"])
    if not cand[key]:
      raise ValueError(f"seed {row['seed']}: the candidate reached the target at its first "
                       f"evaluation ({key} 0), so no ratio exists; expected a target above "
                       "both runs' start")
    log_r.append(math.log(cand[key] / base[key]))
  log_r = np.asarray(log_r)
  k = log_r.size
  mean = float(log_r.mean())
  if k < 2:
    return dict(value=math.exp(mean), lo=float("nan"), hi=float("nan"), seeds=k,
                censored=censored)
  half = float(stats.t.ppf(0.5 + level / 2, k - 1) * log_r.std(ddof=1) / math.sqrt(k))
  return dict(value=math.exp(mean), lo=math.exp(mean - half), hi=math.exp(mean + half),
              seeds=k, censored=censored)


def speedup_verdict(effect: dict[str, Any], speedup: float) -> str:
  """Whether the candidate reaches the target at least `speedup` times faster (ratio
  below 1 / speedup): yes when the interval lies wholly below, no when it lies wholly
  above, inconclusive otherwise (an interval of one point at the bound too: seeds that
  all reach the target at the same evaluation show no saving); indicative with one seed
  (no run-to-run variance)."""
  if effect["seeds"] < 2:
    return "indicative"
  bound = 1.0 / speedup
  if effect["hi"] < bound:
    return "yes"
  if effect["lo"] > bound:
    return "no"
  return "inconclusive"


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
