"""The RL update's settings (`config.rl`, `config.optim`): typed, validated, JAX-free.

`RLSettings` checks each field alone; `check_allocation` checks what depends on the
allocation (n, B_p) and on the sampler (max_new_tokens). The names each registry
answers to live in `isojax.rl.names`, beside nothing that imports JAX, so the config
layer and the planner check them before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import math

from isojax import validation
from isojax.rl import names

# Advantage estimators that normalise within a group and so need n >= 2.
GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "batch_norm")
# What a rollout that hits max_new_tokens earns (`rl.batch.shape_rewards`).
OVERLONG_MODES = ("reward", "zero", "dapo")
# How the peak LR follows the trained batch B: (B / B_ref)^{0, 1/2, 1}.
LR_SCALING_RULES = ("constant", "sqrt", "linear")
# Which policy version samples each step's rollouts when rl.max_staleness > 0
# (`isojax.rl.off_policy.source_version`).
OFF_POLICY_MODES = ("pipeline", "ppo_off_policy", "pipeline_in_flight")
# The sampler/trainer importance correction (`isojax.rl.losses.importance_weights`).
IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
IS_SEQUENCE_RATIOS = ("product", "geometric")


@dataclasses.dataclass(frozen=True)
class RLSettings(validation.Section):
  """`config.rl`; the field comments of `config_lib.base_config` say what each means."""
  advantage: str
  advantage_eps: float
  policy_loss: str
  clip_eps: float
  clip_eps_high: float
  cispo_eps_max: float
  tis_threshold: float
  is_level: str
  is_mode: str
  is_sequence_ratio: str
  aggregation: str
  kl_coef: float
  kl_form: str
  log_kl_to_base: bool
  entropy_coef: float
  zero_variance_filter: str
  num_minibatches: int
  num_epochs: int
  downsample: str
  train_rollouts_per_problem: int
  advantages_on: str
  retire_pass_rate: float
  overlong: str
  overlong_cache_tokens: int
  micro_batch_size: int
  logprob_chunk_size: int
  max_staleness: int
  off_policy: str
  in_flight_tokens: int
  dynamic_sampling: bool
  dynamic_sampling_max_rounds: int
  gamma: float
  gae_lambda: float

  def __post_init__(self):
    for field, choices in names.CHOICES.items():
      validation.choice(f"rl.{field}", getattr(self, field), choices)
    validation.choice("rl.overlong", self.overlong, OVERLONG_MODES)
    validation.choice("rl.off_policy", self.off_policy, OFF_POLICY_MODES)
    validation.choice("rl.is_level", self.is_level, IS_LEVELS)
    validation.choice("rl.is_mode", self.is_mode, IS_MODES)
    validation.choice("rl.is_sequence_ratio", self.is_sequence_ratio, IS_SEQUENCE_RATIOS)
    if 0 < self.tis_threshold <= 1:
      raise ValueError(f"rl.tis_threshold={self.tis_threshold}: expected > 1 (the cap of the "
                       "truncated weights; masked IS keeps ratios in [1/c, c]) or <= 0 (off)")
    validation.non_negative_int("rl.max_staleness", self.max_staleness,
                                "0: sample each step with the policy it updates")
    validation.positive_int("rl.in_flight_tokens", self.in_flight_tokens)
    for field in ("gamma", "gae_lambda"):
      if not 0 <= getattr(self, field) <= 1:
        raise ValueError(f"rl.{field}={getattr(self, field)}: expected in [0, 1]")
    validation.boolean("rl.dynamic_sampling", self.dynamic_sampling)
    validation.positive_int("rl.dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds)
    if self.dynamic_sampling and self.max_staleness and self.off_policy == "pipeline_in_flight":
      raise ValueError("rl.dynamic_sampling with rl.off_policy='pipeline_in_flight': the "
                       "free-running generator samples one round per batch; use 'pipeline' "
                       "or 'ppo_off_policy'")
    validation.positive_int("rl.num_minibatches", self.num_minibatches)
    validation.positive_int("rl.num_epochs", self.num_epochs)
    validation.non_negative_int("rl.train_rollouts_per_problem",
                                self.train_rollouts_per_problem, "0: m = n")
    for field in ("micro_batch_size", "logprob_chunk_size"):
      validation.non_negative_int(f"rl.{field}", getattr(self, field), "0 = off")
    validation.boolean("rl.log_kl_to_base", self.log_kl_to_base)
    if not 0 <= self.retire_pass_rate <= 1:
      raise ValueError(f"rl.retire_pass_rate={self.retire_pass_rate}: expected in [0, 1]")
    if self.entropy_coef and not self.kl_coef:
      raise ValueError("rl.entropy_coef > 0 needs rl.kl_coef > 0: entropy is never used "
                       "without the KL anchor (the IsoCompute easy recipe)")


  @property
  def uses_critic(self) -> bool:
    """PPO with a learned value function: GAE advantages from `config.critic`."""
    return self.advantage == names.GAE

  @property
  def ratio_to_sampler(self) -> bool:
    """The losses' ratios take the sampler's log-probs as the old policy (off-policy runs)."""
    return self.max_staleness > 0

  def train_rollouts(self, n: int) -> int:
    """m: rollouts per problem the update trains on (n unless PODS down-samples)."""
    return self.train_rollouts_per_problem or n

  def check_allocation(self, n: int, problems_per_batch: int, max_new_tokens: int) -> None:
    """The rules that tie these fields to n, B_p and the sampler's max_new_tokens."""
    m, b_p = self.train_rollouts(n), problems_per_batch
    if self.downsample == "none" and m != n:
      raise ValueError(f"rl.train_rollouts_per_problem={m} differs from rollouts_per_problem="
                       f"{n}: set rl.downsample to train on a subset")
    if self.downsample != "none" and n == 1:
      raise ValueError(f"rl.downsample={self.downsample!r} with rollouts_per_problem=1: "
                       "PODS needs n > 1 rollouts to choose from")
    if not 1 <= m <= n:
      raise ValueError(f"rl.train_rollouts_per_problem={m}: expected 1 <= m <= "
                       f"rollouts_per_problem={n}")
    if self.dynamic_sampling and n == 1:
      raise ValueError("rl.dynamic_sampling with rollouts_per_problem=1: a group of one "
                       "rollout never has reward variance to sample for")
    group = n if self.advantages_on == "generated" else m
    if group == 1 and self.advantage in GROUP_ESTIMATORS:
      field = "rollouts_per_problem" if m == n else "rl.train_rollouts_per_problem"
      raise ValueError(f"{field}=1 with rl.advantage={self.advantage!r}: group-normalised "
                       "advantages need at least 2 rollouts per problem")
    if b_p % self.num_minibatches:
      raise ValueError(f"rl.num_minibatches={self.num_minibatches} must divide "
                       f"problems_per_batch={b_p} (a minibatch holds whole groups)")
    minibatch = b_p * m // self.num_minibatches
    size = self.micro_batch_size
    if 0 < size < minibatch and minibatch % size:
      raise ValueError(
          f"rl.micro_batch_size={size} must divide the minibatch of {minibatch} rollouts "
          f"(problems_per_batch * train_rollouts_per_problem / rl.num_minibatches)")
    rollouts = b_p * n
    if 0 < size < rollouts and rollouts % size:
      raise ValueError(f"rl.micro_batch_size={size} must divide the {rollouts} rollouts of a "
                       "step (problems_per_batch * rollouts_per_problem) for the log-prob passes")
    if self.overlong == "dapo" and not 0 < self.overlong_cache_tokens <= max_new_tokens:
      raise ValueError(
          f"rl.overlong='dapo' needs 0 < rl.overlong_cache_tokens <= sampling.max_new_tokens="
          f"{max_new_tokens}; got {self.overlong_cache_tokens}")


# Where the critic's value head reads its features: a decoder of its own, or the policy's.
CRITIC_TRUNKS = ("own", "policy")


@dataclasses.dataclass(frozen=True)
class CriticSettings(validation.Section):
  """`config.critic`: PPO's value model, used when `rl.advantage` is `gae`."""
  trunk: str
  path: str
  train_trunk: bool
  learning_rate: float
  warmup_steps: int
  value_clip: float

  def __post_init__(self):
    validation.choice("critic.trunk", self.trunk, CRITIC_TRUNKS)
    validation.boolean("critic.train_trunk", self.train_trunk)
    if self.trunk == "policy" and self.path:
      raise ValueError(f"critic.trunk='policy' reads the policy's own trunk: leave "
                       f"critic.path empty (got {self.path!r})")
    if self.trunk == "policy" and self.train_trunk:
      raise ValueError("critic.trunk='policy' trains the value head only (the policy's "
                       "loss trains the trunk; a joint loss is not built): set "
                       "critic.train_trunk=False")
    validation.non_negative_int("critic.warmup_steps", self.warmup_steps,
                                "steps that train the critic alone; 0: none")
    if not self.learning_rate > 0:
      raise ValueError(f"critic.learning_rate={self.learning_rate}: expected > 0")
    if not self.value_clip >= 0:
      raise ValueError(f"critic.value_clip={self.value_clip}: expected >= 0 (0: unclipped)")


@dataclasses.dataclass(frozen=True)
class OptimSettings(validation.Section):
  """`config.optim`: AdamW with warm-up, the LR given at the reference batch."""
  learning_rate: float
  lr_reference_batch: int
  lr_scaling: str
  warmup_steps: int
  weight_decay: float
  b1: float
  b2: float
  grad_clip_norm: float

  def __post_init__(self):
    validation.choice("optim.lr_scaling", self.lr_scaling, LR_SCALING_RULES)
    validation.positive_int("optim.lr_reference_batch", self.lr_reference_batch)
    validation.non_negative_int("optim.warmup_steps", self.warmup_steps, "0: no warm-up")
    if not self.learning_rate > 0:
      raise ValueError(f"optim.learning_rate={self.learning_rate}: expected > 0")


  def peak_learning_rate(self, batch_rollouts: int) -> float:
    """The LR for a trained batch of B rollouts: learning_rate * (B / B_ref)^{0, 1/2, 1}."""
    return scaled_learning_rate(self.learning_rate, batch_rollouts, self.lr_reference_batch,
                                self.lr_scaling)


def scaled_learning_rate(base_lr: float, batch_rollouts: int, reference_batch: int,
                         rule: str) -> float:
  """LR for a rollout batch B: base_lr * (B / B_ref)^{0, 1/2, 1}."""
  validation.choice("optim.lr_scaling", rule, LR_SCALING_RULES)
  ratio = batch_rollouts / reference_batch
  return base_lr * {"constant": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[rule]
