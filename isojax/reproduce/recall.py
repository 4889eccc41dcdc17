"""The recall section: the study's easy and hard iso-compute sweeps on the recall task,
whose problems share nothing and whose base pass rates are set by construction, each
under the recipe's square-root LR rule and under a constant LR (the control: the rule
alone favours large n on rare keys), every allocation with the same replicate seeds."""

from __future__ import annotations

import os
from typing import Sequence

from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

SWEEPS = ("configs/sweep_recall_hard.py", "configs/sweep_recall_hard.py:constant_lr",
          "configs/sweep_recall_easy.py", "configs/sweep_recall_easy.py:constant_lr",
          "configs/sweep_recall_easy.py:long", "configs/sweep_recall_easy.py:long_constant_lr")


def run(inv: tables.Invocation, seeds: Sequence[str], budget: int = 0) -> str:
  """study_recall.md and the sweeps' plots in img/ (`budget` 0: each sweep config's own;
  `seeds`: every allocation's replicate seeds); returns the table's path."""
  study_dir = os.path.join(inv.out, f"recall_C{budget}" if budget else "recall")
  findings, wall_s = runs_lib.launch_study(inv, study_dir, budget, SWEEPS,
                                            ["--profile_config=", f"--seeds={','.join(seeds)}"])
  images = runs_lib.study_images(study_dir, inv.results, "recall")
  budgets = (f"C = {budget:,} rollouts in every sweep" if budget else
             "`recall_easy` at C = 4,096 rollouts (32 per key) and `recall_easy_long` at "
             "16,384 (128 per key), `recall_hard` at C = 65,536 (205 per key)")
  body = "\n".join([
      "`launch.study` on the recall task (`configs/recall.py`, the shipped constructed base; "
      "[study.md](../study.md) gives the design): one key token per problem, one answer "
      "token, nothing shared between problems, base pass rates 2^-level at temperature 1. "
      "`recall_easy` and `recall_easy_long` train on the 128 keys of levels 1-2 (p = 1/2, "
      "1/4), `recall_hard` on the 320 keys of levels 4-8 (p = 1/16 to 1/256); " + budgets +
      ". All use the hard recipe with the embedding frozen and evaluate on their own "
      "training keys, since nothing transfers to held-out ones; no transfer row is "
      "measured (there is none by construction). Each sweep runs twice: under the "
      "recipe's square-root LR rule and, as `*_constant_lr`, with the LR at its reference "
      "value for every batch (the control: each key has its own head row and Adam's step "
      f"is about the LR, so the rule alone favours large n on rare keys). Seeds "
      f"{', '.join(seeds)} for every allocation of every sweep.", "",
      findings.strip(), "", *images, ""])
  return tables.write(inv, "study_recall.md",
                      "The study on the recall task: no transfer, difficulty by construction",
                      wall_s, body)
