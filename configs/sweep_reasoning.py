r"""The iso-compute sweep on the reasoning-gym task family (the embedded chain_sum demo).

  python -m launch.sweep --config=configs/sweep_reasoning.py --out=/tmp/isojax/reasoning

The arithmetic sweeps' answers are at most five tokens; the reasoning demo
(configs/reasoning.py: a tiny chat model with a BPE tokenizer, worked rationales, two
end-of-sequence ids, reasoning-gym's own grader, up to 40 new tokens) is closer to the
papers' multi-step outputs. B_p = 16, n in {2, ..., 32} at C = 8,192 rollouts
(M from 256 down to 16): 5 runs on generated problems (no profiled split: the task
family draws its own train and validation problems), 10 log-spaced evaluations each.
The experiment is the iso-compute one (n*'s rise, best/worst@4 slopes, interference),
with no difficulty label: the findings table reports findings 1, 5 and 9 for it.

A run's cost is its C rollouts of up to 40 new tokens plus its evaluations (256
problems x 8 samples each); docs/results/study.md has a study's wall time.

Presets: default, micro (the reasoning micro model; a smoke test).
"""

from isojax.configs import sweep_hard


def get_config(arg=None):
  c = sweep_hard.sweep_config("reasoning", "configs/reasoning.py", split="",
                              budget_rollouts=8192, problems_range=(16, 16),
                              rollouts_range=(2, 32), max_batch_rollouts=512, evals_per_run=10)
  return sweep_hard.with_preset(c, arg)
