"""The per_problem section: per-problem rollout allocation against the uniform allocation
at the same budget, on each testbed of `TESTBEDS` (SmolLM2-135M-Instruct's testbed,
which needs the real model, is the per_problem_smollm2 section's).

Fixed before the runs: for each testbed and seed both arms run the testbed config's
steps; the target is each seed's uniform peak `val/avg@4`, and the statistic the
rollouts the per-problem arm needs to first reach it over the uniform arm's, as a
geometric mean over seeds with a Student's t interval on the seeds' log ratios
(`isojax.tools.time_to_target.ratio_effect`, calibrated in calibration.md) at the level
1 - 0.10 / FAMILY_SIZE (Bonferroni over the three testbeds, this section's two and
SmolLM2's: one claim each). The verdict on "per-problem allocation reaches it with less
compute" is yes when the interval lies wholly below 1, no when wholly above,
inconclusive otherwise. Beside it, each arm's share of groups with a learning signal
(1 - `train/zero_variance_fraction`, averaged over steps), per seed.
The uniform arm is the testbed config's n only, not the best uniform n of a sweep.

Then the per_problem sweep (configs/sweep_per_problem.py: B_p 16, n 4 to 64, each
allocation uniform and per-problem, on the arithmetic base's `mix_hard_easy` split)
with every allocation on each of the section's seeds, through `launch.study`: claim 10
against the whole uniform frontier, decided as the findings table decides it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import numpy as np

from isojax import metrics, run_dir
from isojax.configs import sweep_per_problem
from isojax.planner import bootstrap
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.tools import time_to_target

SWEEP = "configs/sweep_per_problem.py"  # the full-size sweep (claim 10)


@dataclasses.dataclass(frozen=True)
class Testbed:
  name: str
  description: str
  baseline: str                        # the uniform arm's config
  candidate: str                       # the per-problem arm's config
  candidate_flags: tuple[str, ...] = ()
  flags: tuple[str, ...] = ()          # both arms'


TESTBEDS = (
    Testbed("arithmetic", "2- and 3-digit additions (`configs/per_problem.py`): 16 problems "
            "x 8 rollouts a step, 2 to 32 for one problem under per-problem allocation, 100 "
            "steps", "configs/per_problem.py:uniform", "configs/per_problem.py"),
    Testbed("recall", "the recall task (`configs/recall.py`): 512 keys whose base pass rates "
            "are 2^-level, levels 1 to 8; 16 problems x 16 rollouts a step, 2 to 64 for "
            "one key, 200 steps", "configs/recall.py", "configs/recall.py",
            ("--config.rl.allocation=per_problem",)),
)
FAMILY_ALPHA = 0.10
FAMILY_SIZE = len(TESTBEDS) + 1  # the testbeds here and SmolLM2's (per_problem_smollm2)
LEVEL = 1.0 - FAMILY_ALPHA / FAMILY_SIZE


def signal_share(lines: list[dict]) -> float:
  """Mean over the run's steps of the fraction of groups with reward variance."""
  values = [r[metrics.TRAIN_ZERO_VARIANCE] for r in lines if metrics.TRAIN_ZERO_VARIANCE in r]
  return float(1.0 - np.mean(values))


def _rows(inv: tables.Invocation, bed: Testbed, seeds: Sequence[str]
          ) -> tuple[list[dict], dict[str, dict[str, list[dict]]], float]:
  """Each seed's comparison row, each seed's runs' metric lines by arm, and seconds."""
  wall_s, rows, lines_by_seed = 0.0, [], {}
  for seed in seeds:
    runs = {}
    for arm, config, flags in (("baseline", bed.baseline, ()),
                               ("candidate", bed.candidate, bed.candidate_flags)):
      workdir = os.path.join(inv.out, "per_problem", bed.name, f"{arm}_s{seed}")
      wall_s += runs_lib.run_main(inv, config, workdir, seed, (*bed.flags, *flags))
      runs[arm] = run_dir.read_metrics(workdir)
    lines_by_seed[seed] = runs
    rows.append(dict(seed=seed, signal={arm: signal_share(lines) for arm, lines in runs.items()},
                     **time_to_target.compare(runs["baseline"], runs["candidate"],
                                              metrics.val_avg(4))))
  return rows, lines_by_seed, wall_s


def plot(lines_by_seed: dict[str, dict[str, list[dict]]], title: str, path: str) -> None:
  """`val/avg@4` against rollouts sampled, uniform solid and per-problem dashed, a
  colour per seed, each seed's target (its uniform peak) dotted."""
  fig, ax = tables.figure((6, 3.6))
  key = metrics.val_avg(4)
  for index, (seed, runs) in enumerate(lines_by_seed.items()):
    colour = f"C{index}"
    for arm, style in (("baseline", "-"), ("candidate", "--")):
      points = [(r[run_dir.ROLLOUTS], r[key]) for r in runs[arm] if key in r]
      ax.plot(*zip(*points), style, color=colour, marker=".",
              label=f"seed {seed}, {'uniform' if arm == 'baseline' else 'per-problem'}")
    ax.axhline(max(r[key] for r in runs["baseline"] if key in r), color=colour, ls=":",
               lw=0.8)
  ax.set(xlabel="rollouts sampled", ylabel=key, title=title)
  ax.legend(fontsize=6, ncol=2)
  tables.save_figure(fig, path)


def run(inv: tables.Invocation, seeds: Sequence[str]) -> str:
  """per_problem.md and the sweep's plots in img/; returns the table's path."""
  body, wall_s = table(inv, TESTBEDS, seeds)
  rows, images, sweep_s = sweep(inv, seeds)
  body += "\n".join([
      "", "## The per_problem sweep: claim 10 against the uniform frontier", "",
      f"`{SWEEP}` through `launch.study` with seeds {', '.join(seeds)} for every "
      "allocation: log2 of the rollouts per-problem allocation needs to reach the best "
      "final value of any uniform allocation over the uniform allocations' own, with its "
      f"{bootstrap.DEFAULT_LEVEL:.0%} interval over seeds, then problems (a secondary "
      "claim: unadjusted).", "",
      rows, *images, ""])
  return tables.write(inv, "per_problem.md", "Per-problem allocation against uniform",
                      wall_s + sweep_s, body)


def sweep(inv: tables.Invocation, seeds: Sequence[str]) -> tuple[str, list[str], float]:
  """The per_problem sweep with every allocation on each of `seeds` (made or resumed):
  its findings and where each arm's rollouts went, its plots' links and the study's
  seconds."""
  study_dir = os.path.join(inv.out, "per_problem", "sweep")
  design = sweep_per_problem.get_config()
  findings, wall_s = runs_lib.launch_study(inv, study_dir, design.budget_rollouts, (SWEEP,),
                                           (f"--seeds={','.join(seeds)}",))
  text = "\n".join([
      runs_lib.findings_of(findings, design.name),
      "Where each arm's rollouts went, per n (means over seeds of each run's mean over its "
      "steps): the share of groups with a learning signal, and the training reward per "
      "rollout (the rollouts' mean pass rate: lower when more of them go to hard "
      "problems).", "", signal_table(os.path.join(study_dir, design.name, "runs"))])
  return (text,
          runs_lib.study_images(study_dir, inv.results, "per_problem", only=design.name),
          wall_s)


def signal_table(runs_root: str) -> str:
  """Per n of the sweep's runs under `runs_root`, each allocation mode's mean over seeds
  of its runs' `signal_share` and mean `train/reward`."""
  cells: dict[tuple[int, str], list[tuple[float, float]]] = {}
  for workdir in run_dir.find_runs(runs_root):
    config, lines = run_dir.read_config(workdir), run_dir.read_metrics(workdir)
    reward = np.mean([r[metrics.TRAIN_REWARD] for r in lines if metrics.TRAIN_REWARD in r])
    cells.setdefault((config["rollouts_per_problem"], config["rl"]["allocation"]),
                     []).append((signal_share(lines), float(reward)))
  mean = lambda n, mode, i: np.mean([c[i] for c in cells[(n, mode)]])
  rows = ["| n | groups with a signal: uniform | per-problem | training reward: uniform | "
          "per-problem |", "|---|---|---|---|---|"]
  rows += [f"| {n} | {mean(n, 'uniform', 0):.3f} | {mean(n, 'per_problem', 0):.3f} | "
           f"{mean(n, 'uniform', 1):.3f} | {mean(n, 'per_problem', 1):.3f} |"
           for n in sorted({n for n, _ in cells})]
  return "\n".join(rows)


def table(inv: tables.Invocation, beds: Sequence[Testbed], seeds: Sequence[str]
          ) -> tuple[str, float]:
  """The comparison's text on `beds` (each seed's runs made or reused), and its seconds."""
  wall_s, parts, verdicts = 0.0, [], []
  for bed in beds:
    rows, lines_by_seed, seconds = _rows(inv, bed, seeds)
    wall_s += seconds
    image = f"per_problem_{bed.name}.png"
    plot(lines_by_seed, bed.name, os.path.join(inv.results, "img", image))
    parts += [f"**{bed.name}**: {bed.description}.", "",
              time_to_target.markdown_table(rows, metrics.val_avg(4)), "",
              f"![{bed.name}: val/avg@4 against rollouts, each seed's two arms](img/{image})",
              ""]
    verdicts.append(verdict_row(bed.name, rows, LEVEL))
  body = "\n".join([
      "Per-problem allocation (`rl.allocation=per_problem`: each step's B_p x n rollouts "
      "split among its problems by their estimated pass rates) against the uniform "
      "allocation at the same budget (n for every problem), one run per seed and arm. "
      "The target is each seed's uniform peak `val/avg@4`; the cells give where each run "
      "first reached it. The uniform arm is the testbed's n only, not the best uniform n "
      "of a sweep.", "", *parts,
      f"One claim per testbed; the intervals are at {LEVEL:.1%} (Bonferroni over the "
      f"{FAMILY_SIZE} testbeds at {FAMILY_ALPHA:.2f}: arithmetic and recall in "
      "per_problem.md, SmolLM2 in per_problem_smollm2.md).", "",
      VERDICT_HEADER, *verdicts, ""])
  return body, wall_s


VERDICT_HEADER = (
    "| testbed | claim | per-problem / uniform rollouts to the uniform peak, geometric mean "
    "over seeds [interval] | verdict | groups with a signal, per seed: uniform | "
    "per-problem |\n|---|---|---|---|---|---|")


def verdict_row(name: str, rows, level: float) -> str:
  """The claim on the seeds' rollouts ratio, and each arm's share of groups with a signal."""
  effect = time_to_target.ratio_effect(rows, run_dir.ROLLOUTS, level=level)
  censored = (f"; seed(s) {', '.join(map(str, effect['censored']))}: per-problem never "
              "reached the target, counted at the run's end (a lower bound)"
              if effect["censored"] else "")
  share = lambda arm: ", ".join(f"{r['signal'][arm]:.2f}" for r in rows)
  return (f"| {name} | per-problem allocation reaches the uniform peak with less compute | "
          f"{effect['value']:.2f}x [{effect['lo']:.2f}, {effect['hi']:.2f}]{censored} | "
          f"**{time_to_target.speedup_verdict(effect, 1.0)}** | {share('baseline')} | "
          f"{share('candidate')} |")
