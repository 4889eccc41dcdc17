"""The study section: `launch.study` (profile, every sweep of the paper, analyses,
findings) at a budget per sweep; its findings table and plots.

The easy and hard sweeps hold the primary claims (1, 2a, 2b) and run every allocation
with each replicate seed; the other sweeps run their configs' own seeds (one for most,
so their verdicts are indicative: docs/study.md, "How a claim is decided")."""

from __future__ import annotations

from typing import Sequence

from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables


PRIMARY = ("configs/sweep_easy.py", "configs/sweep_hard.py")
SECONDARY = ("configs/sweep_fixed_batch.py", "configs/sweep_problems_per_batch.py",
             "configs/sweep_problem_set_size.py", "configs/sweep_decoupled.py",
             "configs/sweep_algorithms.py", "configs/sweep_reasoning.py")


def run(inv: tables.Invocation, budget: int, seeds: Sequence[str]) -> str:
  """study.md and the study's plots in img/ (`seeds`: the primary sweeps' replicate
  seeds); returns the table's path. The table is written once the primary sweeps are
  done (their verdicts do not wait for the rest) and again with every sweep."""
  study_dir = runs_lib.study_dir(inv, budget)
  findings, wall_s = runs_lib.launch_study(inv, study_dir, budget, PRIMARY,
                                           [f"--seeds={','.join(seeds)}"])
  _write(inv, study_dir, budget, seeds, findings, wall_s, done=False)
  findings, wall_s = runs_lib.launch_study(inv, study_dir, budget, SECONDARY)
  return _write(inv, study_dir, budget, seeds, findings, wall_s, done=True)


def _write(inv: tables.Invocation, study_dir: str, budget: int, seeds: Sequence[str],
           findings: str, wall_s: float, *, done: bool) -> str:
  images = runs_lib.study_images(study_dir, inv.results, "study")
  which = ("the others with their sweep configs' own seeds (each row's `seeds` column)"
           if done else "the other sweeps not yet run (this table is rewritten when they "
           "are)")
  body = "\n".join([f"`launch.study` at C = {budget:,} rollouts per sweep, from the shipped "
                    f"arithmetic base model; the easy and hard sweeps with seeds "
                    f"{', '.join(seeds)} for every allocation, {which}.", "",
                    findings.strip(), "", *images, ""])
  return tables.write(inv, "study.md", "The study: the paper's findings on the tiny default",
                      wall_s, body)
