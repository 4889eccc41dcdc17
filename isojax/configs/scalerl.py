r"""The ScaleRL recipe (Khatri et al. 2025) on the tiny default.

  python -m isojax.main --config=configs/scalerl.py --workdir=/tmp/isojax/scalerl

PipelineRL-8 (step s is sampled by the policy of step s - 8, ahead of the update),
CISPO loss (truncated IS weight x advantage x log-prob, cap 4), prompt-level loss
aggregation, batch-level advantage normalisation, zero-variance filtering of the whole
loss, No-Positive-Resampling (problems with historical pass rate >= 0.9 leave the pool),
float32 logits at the LM head, no KL or entropy terms. The task mixes 2- and 3-digit
additions so that both solved and unsolved problems exist. Presets as in hard.py.
"""

from isojax import config_lib


def get_config(arg=None):
  config = config_lib.apply_recipe(config_lib.base_config(), "hard")
  config.task.update(min_digits=2, max_digits=3)
  config.rollouts_per_problem = 16
  config.problems_per_batch = 16
  config.num_steps = 200
  config.model.fp32_lm_head = True
  config.rl.update(max_staleness=8, off_policy="pipeline", policy_loss="cispo",
                   cispo_eps_max=4.0, aggregation="prompt_mean", advantage="batch_norm",
                   zero_variance_filter="all", retire_pass_rate=0.9)
  return config_lib.apply_preset(config, arg)
