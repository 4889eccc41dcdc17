"""The prescription check: does the allocation `launch.plan` prescribes from a study's fit
beat another allocation at a budget the study did not run?

The rule, fixed before its runs:
  1. `launch.plan --analysis=` on the fitted sweep prescribes (n, B_p, M) for the
     check's budget within the sweep's own ranges (`Design.plan_flags`);
  2. the comparison is the allocation of the same iso-compute grid (`launch.plan
     --grid`, same B_p) whose n lies farthest from the prescribed one in log2 (a tie:
     the smaller n);
  3. both run once per seed; the statistic is the difference of their mean final
     `val/avg@4` (prescribed minus comparison; a run's final as the experiments take it,
     `experiments.final_value`), with the study's hierarchical bootstrap (seeds drawn
     within each arm, one draw of validation problems shared by both);
  4. the prescription wins (yes) when the 90% interval lies above 0, loses (no) when it
     lies below, and the check is inconclusive otherwise (indicative with one seed an
     arm: its interval then omits run-to-run variance).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from typing import Any, Sequence

import numpy as np

from isojax import metrics, run_dir
from isojax.planner import bootstrap, experiments, prescribe
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

METRIC = metrics.val_avg(4)
ARMS = ("prescribed", "comparison")


@dataclasses.dataclass(frozen=True)
class Design:
  analysis: str                   # the fitted sweep's analysis.json
  base_config: str                # config file[:preset] the allocations go into
  budget: int                     # C of the check, in rollouts
  plan_flags: tuple[str, ...]     # launch.plan's ranges and the base config's overrides
  seeds: tuple[str, ...]          # each arm runs once per seed


class NoPrescription(RuntimeError):
  """The fit has no n*(C) law to prescribe from (`launch.plan`'s one-line error)."""


def _plan(inv: tables.Invocation, design: Design, out_dir: str, *extra: str) -> dict:
  """`launch.plan`'s JSON. Raises NoPrescription when it refuses the fit for having no
  law, the one refusal the check reports as a finding; any other failure (a bad flag,
  an import error) is a RuntimeError with its output, so it cannot pass for one."""
  cmd = [sys.executable, "-m", "launch.plan", f"--budget_rollouts={design.budget}",
         f"--config={design.base_config}", *design.plan_flags, f"--out={out_dir}", *extra]
  proc = subprocess.run(cmd, cwd=inv.repo, capture_output=True, text=True)
  if proc.returncode:
    lines = [l for l in proc.stderr.splitlines() if "error" in l.lower()] or ["(no message)"]
    if prescribe.NO_LAW in lines[-1]:
      raise NoPrescription(lines[-1].strip())
    raise RuntimeError(f"{' '.join(cmd[1:])} exited {proc.returncode}:\n"
                       f"{proc.stderr[-3000:]}")
  return json.loads(proc.stdout)


def comparison(prescribed: dict[str, Any], allocations: Sequence[dict[str, Any]]
               ) -> dict[str, Any]:
  """The grid's allocation at the prescription's B_p with n farthest from the
  prescribed n in log2 (a tie: the smaller n)."""
  n = prescribed["rollouts_per_problem"]
  same_bp = [a for a in allocations
             if a["problems_per_batch"] == prescribed["problems_per_batch"]
             and a["rollouts_per_problem"] != n]
  if not same_bp:
    raise ValueError(f"the grid at C = {prescribed['budget_rollouts']} has no other n at "
                     f"B_p = {prescribed['problems_per_batch']} to compare with")
  return max(same_bp, key=lambda a: (abs(math.log2(a["rollouts_per_problem"] / n)),
                                     -a["rollouts_per_problem"]))


def plans(inv: tables.Invocation, design: Design, out_dir: str
          ) -> dict[str, dict[str, Any]]:
  """{arm: its allocation and written config (`config_path`)}."""
  prescribed = _plan(inv, design, out_dir, f"--analysis={design.analysis}")
  grid = _plan(inv, design, out_dir, "--grid")
  return dict(prescribed=prescribed, comparison=comparison(prescribed, grid["allocations"]))


def prescription_note(prescribed: dict[str, Any]) -> str:
  """What `launch.plan` prescribed, and whether the check's budget lies within the
  compute the law was fitted on or beyond it (an extrapolation of the law)."""
  lo, hi = prescribed["law"]["compute_range"]
  where = "beyond" if prescribed["extrapolated"] else "within"
  return (f"`launch.plan` prescribed n = {prescribed['rollouts_per_problem']} at B_p = "
          f"{prescribed['problems_per_batch']} (the fitted n*(C) at C = "
          f"{prescribed['budget_rollouts_requested']:,}: {prescribed['n_star']:.1f}), "
          f"{where} the compute its law was fitted on ({lo:,.0f} to {hi:,.0f} rollouts)"
          + (": an extrapolation of the law." if prescribed["extrapolated"] else "."))


def difference(curves: dict[str, list]) -> dict[str, float]:
  """The statistic: mean final of the prescribed arm minus the comparison's."""
  mean = lambda arm: np.mean([experiments.final_value(c) for c in curves[arm]])
  return dict(difference=float(mean("prescribed") - mean("comparison")))


def decide(workdirs: dict[str, Sequence[str]], *, num_resamples: int = 1000, seed: int = 0
           ) -> dict[str, Any]:
  """The effect (value, 90% interval) and the verdict from each arm's finished runs."""
  groups = {arm: [bootstrap.problem_curve(run_dir.load_run(w), METRIC) for w in dirs]
            for arm, dirs in workdirs.items()}
  point, samples = bootstrap.bootstrap(groups, difference, num_resamples=num_resamples,
                                       seed=seed)
  e = bootstrap.effect(point["difference"], samples["difference"])
  # One seed an arm: the interval resamples problems only, not runs (as the findings'
  # one-seed rows, indicative).
  one_seed = min(len(dirs) for dirs in workdirs.values()) < 2
  return dict(e, verdict="indicative" if one_seed else bootstrap.sign_verdict(e))


def run(inv: tables.Invocation, design: Design, out_dir: str) -> tuple[str, float]:
  """Plans and runs both arms under `out_dir` (resumed when rerun), their runs side by
  side (`runs.run_in_parallel`); (a markdown section with the allocations, each run's
  final and the verdict, the elapsed wall seconds)."""
  try:
    arms = plans(inv, design, out_dir)
  except NoPrescription as e:  # the fit's frontier had too few points, or none rose
    return (f"Not run: `launch.plan --analysis={design.analysis}` prescribed nothing "
            f"({e}).", 0.0)
  workdirs = {arm: [os.path.join(out_dir, f"{arm}_s{seed}") for seed in design.seeds]
              for arm in arms}
  wall_s = runs_lib.run_in_parallel(inv, [
      runs_lib.Job(f"configs/from_json.py:{arms[arm]['config_path']}", workdir, seed)
      for arm in arms for seed, workdir in zip(design.seeds, workdirs[arm])], out_dir)
  rows = []
  for arm, a in arms.items():
    for seed, workdir in zip(design.seeds, workdirs[arm]):
      curve = bootstrap.problem_curve(run_dir.load_run(workdir), METRIC)
      rows.append(f"| {arm} | {a['rollouts_per_problem']} | {a['problems_per_batch']} | "
                  f"{a['num_steps']} | {seed} | {curve.curve().values_E[0]:.3f} | "
                  f"{experiments.final_value(curve.curve()):.3f} |")
  e = decide(workdirs)
  body = "\n".join([
      prescription_note(arms["prescribed"]), "",
      "| arm | n | B_p | M | seed | step-0 `val/avg@4` | final |",
      "|---|---|---|---|---|---|---|", *rows, "",
      f"Prescribed minus comparison, mean final `val/avg@4` over seeds: "
      f"{e['value']:+.3f} [{e['lo']:+.3f}, {e['hi']:+.3f}] (90%, seeds then problems "
      f"resampled): the prescription wins: **{e['verdict']}**."])
  return body, wall_s
