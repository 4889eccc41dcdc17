"""The saturation section: the study's easy and hard sweeps trained on past the study's
budget, each run resumed where the study's run ended (`launch.study --extend`: the same
run trained longer), one stage per budget, to see whether the allocations saturate.

Stage C starts as a copy of the stage before it (the first: the study section's
directory, splits and runs with their checkpoints), so each stage's directory keeps the
runs as they were at its budget; a stage whose source is missing runs its sweeps from
the start.
"""

from __future__ import annotations

import math
import os
import shutil
from typing import Any, Sequence

import numpy as np
import scipy.stats

from isojax import run_dir, storage
from isojax.planner import bootstrap, verdicts
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

SWEEPS = ("configs/sweep_easy.py", "configs/sweep_hard.py")
# The two sweeps' directories, and what a stage copies from the one before: the profiled
# splits and the sweeps.
_SWEEP_DIRS = ("easy", "hard")
_COPIED = ("splits", *_SWEEP_DIRS)


def stage_dir(out: str, budget: int) -> str:
  return os.path.join(out, f"saturation_C{budget}")


def _start_stage(source: str, target: str) -> None:
  """`target` as a copy of `source`'s splits and sweeps, unless it exists or `source`
  does not (then the stage runs its sweeps from the start). Copied whole or not at all."""
  if os.path.isdir(target) or not all(os.path.isdir(os.path.join(source, name))
                                      for name in _COPIED):
    return
  partial = target + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  for name in _COPIED:
    shutil.copytree(os.path.join(source, name), os.path.join(partial, name))
  os.replace(partial, target)


def run_seconds(stage: str, before: str) -> float:
  """Seconds the stage's runs spent in steps and evaluations (each run's `wall_s`),
  summed over its runs, less what their copies in `before` had spent: the stage's
  machine time, however many invocations it took (work an interrupted run lost after
  its last checkpoint is not counted; its rerun's is)."""
  total = 0.0
  for sweep in _SWEEP_DIRS:
    for workdir in run_dir.find_runs(os.path.join(stage, sweep, "runs")):
      start_dir = os.path.join(before, os.path.relpath(workdir, stage))
      end = run_dir.last_metrics(workdir)
      start = run_dir.last_metrics(start_dir) if os.path.isdir(start_dir) else None
      total += (end[run_dir.WALL_S] if end else 0.0) - (start[run_dir.WALL_S] if start
                                                        else 0.0)
  return total


# The normal quantile of the findings' two-sided level (90%): a fitted asymptote's interval
# from its standard error.
Z = float(scipy.stats.norm.ppf(0.5 + bootstrap.DEFAULT_LEVEL / 2))


Series = dict[str, tuple[list[float], list[float]]]  # metric -> (rollouts, values)


def evaluations(analysis: dict[str, Any]) -> dict[tuple[int, int], list[Series]]:
  """(B_p, n) -> per run (one per seed) every evaluation of the analysis's metric and its
  views (best@k, worst@k), read from the run of each record: analysis.json's records
  list only a run's record-breaking points, which leave out a final evaluation below an
  earlier one."""
  metrics = [analysis["metric"], *analysis.get("views", {})]
  out: dict[tuple[int, int], list[Series]] = {}
  for record in sorted(analysis["records"], key=lambda r: r["path"]):
    run = run_dir.load_run(record["path"])
    out.setdefault((record["problems_per_batch"], record["rollouts_per_problem"]), []).append(
        {m: run.series(m) for m in metrics})
  return out


def _end_and_gain(series: Series, metric: str, since: float) -> tuple[float, float]:
  """A run's final value of `metric` and what it added since `since` rollouts."""
  rollouts, values = series[metric]
  before = [v for c, v in zip(rollouts, values) if c <= since]
  return values[-1], values[-1] - before[-1] if before else math.nan


def allocation_rows(analysis: dict[str, Any], since: float,
                    evals: dict[tuple[int, int], list[Series]]) -> list[dict[str, Any]]:
  """Per allocation of a sweep's analysis.json: its runs' final evaluation (the mean over
  its seeds), its fitted asymptote A with a 90% interval (A +- Z * stderr), and whether
  it has reached A: True when the interval's upper end is within
  `verdicts.EQUIVALENCE_MARGIN` of the final value (at most that much is left), False
  when its lower end is above the final value (still rising), None otherwise (the
  interval is too wide to tell, or A's error is undetermined). A flat fit has no rise
  left. `gain`: the final value less the last evaluation within `since` rollouts (the
  stage before's end), what the stage added, with no fitted model (mean over seeds).
  `views`: the analysis's other metrics (best@k, worst@k) at the runs' end. `seeds`: how
  many runs each mean is over. `evals`: from `evaluations`."""
  metric, names = analysis["metric"], list(analysis.get("views", {}))
  rows = []
  for f in sorted(analysis["fits"], key=lambda f: (f["problems_per_batch"],
                                                  f["rollouts_per_problem"])):
    key = (f["problems_per_batch"], f["rollouts_per_problem"])
    ends = [_end_and_gain(series, metric, since) for series in evals[key]]
    final = float(np.mean([e for e, _ in ends]))
    a, se = f["a"], f.get("a_stderr")
    lo, hi = (a - Z * se, a + Z * se) if se is not None else (math.nan, math.nan)
    reached = (True if f.get("flat") else None if se is None else
               True if hi <= final + verdicts.EQUIVALENCE_MARGIN else False if lo > final
               else None)
    rows.append(dict(problems_per_batch=key[0], rollouts_per_problem=key[1], final=final,
                     asymptote=a, lo=lo, hi=hi, flat=bool(f.get("flat")), reached=reached,
                     gain=float(np.mean([g for _, g in ends])), seeds=len(ends),
                     views={m: float(np.mean([s[m][1][-1] if s[m][1] else math.nan
                                              for s in evals[key]])) for m in names}))
  return rows


def allocation_table(sweep: str, rows: list[dict[str, Any]], since: float) -> list[str]:
  reached = sum(r["reached"] is True for r in rows)
  verdict = {True: "yes", False: "no", None: "undetermined"}
  names = list(rows[0]["views"]) if rows else []
  views = "".join(f" final {m.removeprefix('val/')} |" for m in names)
  rising = sum(r["reached"] is False for r in rows)
  counts = {r.get("seeds", 1) for r in rows}
  seeds = f" (mean of {max(counts)} seeds)" if max(counts, default=1) > 1 else ""
  lines = [f"**{sweep}**: {reached} of {len(rows)} allocations have reached their fitted "
           f"asymptote (its 90% interval ends within {verdicts.EQUIVALENCE_MARGIN} above the "
           f"final value), {rising} were still rising (the interval lies above it), the "
           f"other {len(rows) - reached - rising} undetermined.", "",
           f"| B_p | n | final avg@4{seeds} | gain since C = {since:,.0f} | fitted asymptote "
           f"[90% CI] | reached |{views}",
           "|---|---|---|---|---|---|" + "---|" * len(names)]
  for r in rows:
    fit = ("flat (no rise)" if r["flat"] else
           f"{r['asymptote']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}]" if math.isfinite(r["lo"])
           else f"{r['asymptote']:.3f} [undetermined]")
    lines.append(f"| {r['problems_per_batch']} | {r['rollouts_per_problem']} | "
                 f"{r['final']:.3f} | {r['gain']:+.3f} | {fit} | {verdict[r['reached']]} |"
                 + "".join(f" {r['views'][m]:.3f} |" for m in names))
  return lines


def _stage_body(budget: int, study_budget: int, stage: str, before: str, since: int,
                findings: str, images: list[str]) -> str:
  title, _, rest = findings.strip().partition("\n")
  del title  # the stage's own heading replaces it
  allocations = []
  for sweep in _SWEEP_DIRS:
    path = os.path.join(stage, sweep, "analysis.json")
    if os.path.isfile(path):
      analysis = storage.read_json(path)
      rows = allocation_rows(analysis, since, evaluations(analysis))
      allocations += allocation_table(sweep, rows, since) + [""]
  hours, minutes = divmod(round(run_seconds(stage, before) / 60), 60)
  cost = (f"Machine time: {hours} h {minutes:02d} min, the runs' steps and evaluations "
          f"since {os.path.basename(before)} (each run's `wall_s`), summed over the runs, "
          "which ran one per core at a time.")
  return "\n".join([f"## C = {budget:,} rollouts per sweep ({budget // study_budget}x the "
                    "study's)", "", cost, "", *allocations,
                    rest.strip().replace("\n## ", "\n### "), "", *images, ""])


def run(inv: tables.Invocation, study_budget: int, budgets: Sequence[int],
        seeds: Sequence[str]) -> str:
  """study_saturation.md and each stage's plots in img/; returns the table's path.
  `seeds`: the replicate seeds of every allocation, the study section's own (its runs
  are the ones trained on; another set would start new runs from step 0)."""
  if not budgets or any(b <= study_budget for b in budgets):
    raise ValueError(f"saturation budgets {list(budgets)}: expected budgets above the "
                     f"study's ({study_budget})")
  source, since = os.path.join(inv.out, f"study_C{study_budget}"), study_budget
  bodies, wall_s = [], 0.0
  for budget in sorted(budgets):
    target = stage_dir(inv.out, budget)
    _start_stage(source, target)
    findings, stage_s = runs_lib.launch_study(inv, target, budget, SWEEPS,
                                              ["--extend", f"--seeds={','.join(seeds)}"])
    wall_s += stage_s
    images = runs_lib.study_images(target, inv.results, f"saturation_C{budget}")
    bodies.append(_stage_body(budget, study_budget, target, source, since, findings,
                              images))
    source, since = target, budget
  body = "\n".join([
      f"The study's easy and hard sweeps (`configs/sweep_easy.py`, `sweep_hard.py`: 12 "
      f"allocations each with seeds {', '.join(seeds)}, from the shipped arithmetic base) "
      f"trained on past the study's C = {study_budget:,} rollouts: every run resumes where "
      "it ended "
      "(`launch.study --extend`, the same run trained longer: the problem order and every "
      "key are functions of the step, and the learning rate is constant after its warm-up) "
      "and runs to the stage's budget. Each stage gives, per allocation, the final value "
      "and what the stage added to it (two single evaluations, each with its sampling "
      "error, `val/avg@4_stderr` in the run's metrics.jsonl), "
      "the fitted sigmoid's asymptote with its 90% interval, whether the run has "
      "reached it (at most the K row's margin left), was still rising, or cannot tell, "
      "and its final best@4 and worst@4 (claims 2a and 2b compare these across n); "
      "then the study's "
      "findings table on those two sweeps: its S row says whether the runs were still "
      "rising when that budget ran out, its K row whether every n heads for one ceiling. "
      "The header's wall time sums every invocation of the command, reruns included; "
      "each stage's machine time counts its runs' steps and evaluations alone.", "",
      *bodies])
  return tables.write(inv, "study_saturation.md",
                      "The study past saturation: the easy and hard sweeps trained on",
                      wall_s, body)
