"""The algorithms section: the PPO, DAPO and LoRA presets over seeds, and the RQ4 sweep.

The presets run as the demos do (`demos.table`). The RQ4 sweep
(configs/sweep_algorithms.py: GRPO's n*(C) under CISPO, PODS and PPO) is one of the
study's sweeps: the section runs it through `launch.study` in the study section's
directory (resumed there, so it runs once for both sections) and shows its rows.
"""

from __future__ import annotations

import os
from typing import Sequence

from isojax.reproduce import demos
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

# (name, config): the algorithm presets beside GRPO's demos.
ALGORITHMS = (("ppo", "configs/ppo.py"), ("dapo", "configs/dapo.py"),
              ("lora", "configs/lora.py"))
SWEEP, SWEEP_CONFIG = "algorithms", "configs/sweep_algorithms.py"  # RQ4, in the study


def run(inv: tables.Invocation, seeds: Sequence[str], budget: int) -> str:
  """algorithms.md and the sweep's plots in img/; returns the table's path."""
  wall_s, runs = runs_lib.run_presets(inv, "algorithms", ALGORITHMS, seeds)
  study_dir = runs_lib.study_dir(inv, budget)
  findings, _ = runs_lib.launch_study(inv, study_dir, budget, [SWEEP_CONFIG])
  sweep_s = runs_lib.sweep_seconds(os.path.join(study_dir, SWEEP))  # not the study's
  findings = runs_lib.findings_of(findings, SWEEP)
  images = runs_lib.study_images(study_dir, inv.results, "algorithms", only=SWEEP)
  body = "\n".join([
      "The presets as shipped, from the shipped arithmetic base model, one run per RL seed "
      "(`--config.seed`); columns as in [demos.md](demos.md). `configs/ppo.py`: PPO with a "
      "critic (GAE), n = 4, B_p = 64. `configs/dapo.py`: clip-higher, token mean, overlong "
      "shaping and dynamic sampling (its `rollouts` count every round). `configs/lora.py`: "
      "the hard recipe training rank-8 LoRA adapters only (LR 1e-3).", "",
      demos.table(runs), "",
      f"The RQ4 sweep (`configs/sweep_algorithms.py`: the hard split, B_p = 16, n from 2 to "
      f"64 at C = {budget:,} rollouts, each algorithm in its own sweep) through "
      "`launch.study`, as one of the study's sweeps (one seed per allocation, so its "
      "verdicts are indicative); its findings rows (n*'s rise over the compute frontier, "
      "with a bootstrap interval, per algorithm):", "", findings.strip(), "", *images, ""])
  return tables.write(inv, "algorithms.md", "The algorithm presets and RQ4",
                      wall_s + sweep_s, body)
