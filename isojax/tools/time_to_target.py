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


def ratio_effect(rows: Sequence[dict], key: str, *, resamples: int = 2000,
                 seed: int = 0, level: float = bootstrap.DEFAULT_LEVEL) -> dict[str, Any]:
  """The candidate's `key` (rollouts or wall_s) to reach the target over the baseline's,
  across seeds: the geometric mean of the per-seed ratios and its `level` (90%) interval
  from a bootstrap over seeds (log ratios drawn with replacement and moved from their
  mean by `bootstrap.seed_scale(k)`, as the study's bootstrap does). A seed whose candidate never
  reached the target counts with its run's end (a lower bound on its ratio) and is
  listed in `censored`."""
  log_r, censored = [], []
  for row in rows:
    base, cand = row["baseline"], row["candidate"]
    if cand is None:
      cand = row["candidate_end"]
      censored.append(row["seed"])
    log_r.append(math.log(cand[key] / base[key]))
  log_r = np.asarray(log_r)
  k = log_r.size
  value = float(np.exp(log_r.mean()))
  if k < 2:
    return dict(value=value, lo=float("nan"), hi=float("nan"), seeds=k, censored=censored)
  rng = np.random.default_rng(seed)
  mean = log_r.mean()
  picks = rng.integers(0, k, (resamples, k))
  means = mean + bootstrap.seed_scale(k) * (log_r[picks].mean(axis=1) - mean)
  tail = 50.0 * (1.0 - level)
  lo, hi = np.exp(np.percentile(means, [tail, 100.0 - tail]))
  return dict(value=value, lo=float(lo), hi=float(hi), seeds=k, censored=censored)


def speedup_verdict(effect: dict[str, Any], speedup: float) -> str:
  """Whether the candidate reaches the target at least `speedup` times faster (ratio
  <= 1 / speedup): yes when the interval lies there, no when it lies wholly above,
  inconclusive otherwise; indicative with one seed (no run-to-run variance)."""
  if effect["seeds"] < 2:
    return "indicative"
  bound = 1.0 / speedup
  if effect["hi"] <= bound:
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
