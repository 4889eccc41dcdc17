"""The saturation section: the study's easy and hard sweeps trained on past the study's
budget, each run resumed where the study's run ended (`launch.study --extend`: the same
run trained longer), one stage per budget, to see whether the allocations saturate.

Stage C starts as a copy of the stage before it (the first: the study section's
directory, splits and runs with their checkpoints), so each stage's directory keeps the
runs as they were at its budget; a stage whose source is missing runs its sweeps from
the start.
"""

from __future__ import annotations

import os
import shutil
from typing import Sequence

from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

SWEEPS = ("configs/sweep_easy.py", "configs/sweep_hard.py")
# What a stage copies from the one before: the profiled splits and the two sweeps.
_COPIED = ("splits", "easy", "hard")


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


def _stage_body(budget: int, study_budget: int, findings: str, images: list[str]) -> str:
  title, _, rest = findings.strip().partition("\n")
  del title  # the stage's own heading replaces it
  return "\n".join([f"## C = {budget:,} rollouts per sweep ({budget // study_budget}x the "
                    "study's)", "", rest.strip().replace("\n## ", "\n### "), "", *images, ""])


def run(inv: tables.Invocation, study_budget: int, budgets: Sequence[int]) -> str:
  """study_saturation.md and each stage's plots in img/; returns the table's path."""
  if not budgets or any(b <= study_budget for b in budgets):
    raise ValueError(f"saturation budgets {list(budgets)}: expected budgets above the "
                     f"study's ({study_budget})")
  source = os.path.join(inv.out, f"study_C{study_budget}")
  bodies, wall_s = [], 0.0
  for budget in sorted(budgets):
    target = stage_dir(inv.out, budget)
    _start_stage(source, target)
    findings, stage_s = runs_lib.launch_study(inv, target, budget, SWEEPS, ["--extend"])
    wall_s += stage_s
    images = runs_lib.study_images(target, inv.results, f"saturation_C{budget}")
    bodies.append(_stage_body(budget, study_budget, findings, images))
    source = target
  body = "\n".join([
      f"The study's easy and hard sweeps (`configs/sweep_easy.py`, `sweep_hard.py`: 12 "
      f"allocations each, from the shipped arithmetic base) trained on past the study's "
      f"C = {study_budget:,} rollouts: every run resumes where it ended "
      "(`launch.study --extend`, the same run trained longer: the problem order and every "
      "key are functions of the step, and the learning rate is constant after its warm-up) "
      "and runs to the stage's budget. Each stage's table is the study's findings table on "
      "those two sweeps; its S row says whether the runs were still rising when that "
      "budget ran out, its K row whether every n heads for one ceiling. The wall time is "
      "the extensions' alone.", "", *bodies])
  return tables.write(inv, "study_saturation.md",
                      "The study past saturation: the easy and hard sweeps trained on",
                      wall_s, body)
