"""The algorithms section: the PPO, DAPO and LoRA presets over seeds, and the RQ4 sweep.

The presets run as the demos do (`demos.table`); the RQ4 sweep
(configs/sweep_algorithms.py: GRPO's n*(C) under CISPO, PODS and PPO) runs through
`launch.study` at the section's budget.
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


def run(inv: tables.Invocation, seeds: Sequence[str], budget: int) -> str:
  """algorithms.md and the sweep's plots in img/; returns the table's path."""
  wall_s, runs = runs_lib.run_presets(inv, "algorithms", ALGORITHMS, seeds)
  study_dir = os.path.join(inv.out, f"algorithms_C{budget}")
  findings, sweep_s = runs_lib.launch_study(inv, study_dir, budget,
                                            ["configs/sweep_algorithms.py"])
  images = runs_lib.study_images(study_dir, inv.results, "algorithms")
  body = "\n".join([
      "The presets as shipped, from the shipped arithmetic base model, one run per RL seed "
      "(`--config.seed`); columns as in [demos.md](demos.md). `configs/ppo.py`: PPO with a "
      "critic (GAE), n = 4, B_p = 64. `configs/dapo.py`: clip-higher, token mean, overlong "
      "shaping and dynamic sampling (its `rollouts` count every round). `configs/lora.py`: "
      "the hard recipe training rank-8 LoRA adapters only (LR 1e-3).", "",
      demos.table(runs), "",
      f"The RQ4 sweep (`configs/sweep_algorithms.py`: the hard split, B_p = 16, n from 2 to "
      f"64 at C = {budget:,} rollouts, each algorithm in its own sweep) through "
      "`launch.study`; its findings rows (n*'s rise over the compute frontier, with a "
      "bootstrap interval, per algorithm):", "", findings.strip(), "", *images, ""])
  return tables.write(inv, "algorithms.md", "The algorithm presets and RQ4",
                      wall_s + sweep_s, body)
