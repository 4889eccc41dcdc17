r"""The ScaleRL recipe (Khatri et al. 2025) on the tiny default.

  python -m isojax.main --config=configs/scalerl.py --workdir=/tmp/isojax/scalerl
  # the same recipe with synchronous generation (sample each step with its own policy):
  python -m isojax.main --config=configs/scalerl.py:sync --workdir=/tmp/isojax/scalerl_sync

PipelineRL-8 (step s is sampled by the policy of step s - 8, ahead of the update),
CISPO loss (truncated IS weight x advantage x log-prob, cap 4), prompt-level loss
aggregation, batch-level advantage normalisation, zero-variance filtering of the whole
loss, No-Positive-Resampling (problems with historical pass rate >= 0.9 leave the pool),
float32 logits at the LM head, no KL or entropy terms. The task mixes 2- and 3-digit
additions so that both solved and unsolved problems exist. Presets as in hard.py,
combined with the variant as `:micro,sync`.

ScaleRL's forced interruptions (`sampling.think_budget`) are not set: the tiny model
writes no thinking, and its 8 new tokens could not hold the interruption text. Set
them for a thinking model (docs/sampling.md).
"""

from isojax.config import config_lib


def get_config(arg=None):
  names = [a for a in (arg or "").split(",") if a]
  sync = "sync" in names
  presets = [a for a in names if a != "sync"]
  if len(presets) > 1:
    raise ValueError(f"configs/scalerl.py:{arg}: expected at most one preset besides 'sync'")
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.update(min_digits=2, max_digits=3)
  config.rollouts_per_problem = 16
  config.problems_per_batch = 16
  config.num_steps = 200
  config.model.fp32_lm_head = True
  config.rl.update(max_staleness=8, off_policy="pipeline", policy_loss="cispo",
                   cispo_eps_max=4.0, aggregation="prompt_mean", advantage="batch_norm",
                   zero_variance_filter="all", retire_pass_rate=0.9)
  if sync:
    config.rl.max_staleness = 0
  return config_lib.apply_preset(config, presets[0] if presets else None)
