"""The names each RL registry answers to, without the registries (no JAX imported).

The registries (`advantages.ADVANTAGE_ESTIMATORS`, `losses.POLICY_LOSSES`, ...) are
keyed by these tuples, and tests/rl/test_registry_names.py proves each registry's keys
equal its tuple, so the settings (`rl.settings.RLSettings`) and the planner can check
`rl.*` fields before anything is compiled without importing JAX or the registries.
"""

ADVANTAGES = ("grpo", "drgrpo", "batch_norm", "rloo")
# PPO's generalised advantage estimation from a critic's values (`isojax.rl.critic`):
# per token, not from the group, so it has no place in the group-estimator registry.
GAE = "gae"
POLICY_LOSSES = ("ppo_clip", "dapo", "cispo", "gspo")
AGGREGATIONS = ("token_mean", "sequence_mean", "constant", "prompt_mean")
KL_FORMS = ("k1", "k2", "k3")
DOWNSAMPLERS = ("max_variance", "max_reward", "random")
ZERO_VARIANCE_MODES = ("off", "all", "regularizers")
ADVANTAGES_ON = ("selected", "generated")

# config.rl field -> the names it may take.
CHOICES = {
    "advantage": (*ADVANTAGES, GAE),
    "policy_loss": POLICY_LOSSES,
    "aggregation": AGGREGATIONS,
    "kl_form": KL_FORMS,
    "downsample": ("none", *DOWNSAMPLERS),
    "zero_variance_filter": ZERO_VARIANCE_MODES,
    "advantages_on": ADVANTAGES_ON,
}
