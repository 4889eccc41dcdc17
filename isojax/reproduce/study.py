"""The study section: `launch.study` (profile, every sweep of the paper, analyses,
findings) at a budget per sweep; its findings table and plots."""

from __future__ import annotations

import os

from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables


def run(inv: tables.Invocation, budget: int) -> str:
  """study.md and the study's plots in img/; returns the table's path."""
  study_dir = os.path.join(inv.out, f"study_C{budget}")
  findings, wall_s = runs_lib.launch_study(inv, study_dir, budget)
  images = runs_lib.study_images(study_dir, inv.results, "study")
  body = "\n".join([f"`launch.study` at C = {budget:,} rollouts per sweep, from the shipped "
                    "arithmetic base model.", "", findings.strip(), "", *images, ""])
  return tables.write(inv, "study.md", "The study: the paper's findings on the tiny default",
                      wall_s, body)
