"""The RL settings (`config.rl`, `config.critic`, `config.optim`, `config.guard`): typed,
validated, JAX-free, each field with its default and meaning (`validation.field`).

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

F = validation.field

# Advantage estimators that normalise within a group and so need n >= 2.
GROUP_ESTIMATORS = ("grpo", "drgrpo", "rloo", "batch_norm")
# What a rollout that hits max_new_tokens earns (`rl.batch.shape_rewards`).
OVERLONG_MODES = ("reward", "zero", "dapo")
# How the peak LR follows the trained batch B: (B / B_ref)^{0, 1/2, 1}.
LR_SCALING_RULES = ("constant", "sqrt", "linear")
# How a step's B_p * n rollouts are spread over its problems (`isojax.rl.rollout_allocation`).
ALLOCATIONS = ("uniform", "per_problem")
# Which policy version samples each step's rollouts when rl.max_staleness > 0
# (`isojax.rl.off_policy.source_version`).
OFF_POLICY_MODES = ("pipeline", "ppo_off_policy", "pipeline_in_flight")
# The sampler/trainer importance correction (`isojax.rl.losses.importance_weights`).
IS_LEVELS = ("token", "sequence")
IS_MODES = ("truncate", "mask")
IS_SEQUENCE_RATIOS = ("product", "geometric")


@dataclasses.dataclass(frozen=True)
class RLSettings(validation.Section):
  """`config.rl`: the advantage, the loss and its regularisers, PODS, off-policy
  generation and dynamic sampling ([rl_algorithms.md](rl_algorithms.md))."""
  advantage: str = F("grpo", "`grpo`, `drgrpo`, `batch_norm`, `rloo`, or `gae` (PPO with a "
                     "critic)")
  advantage_eps: float = F(1e-6, "floor of the standard deviation in normalised advantages")
  policy_loss: str = F("ppo_clip", "`ppo_clip`, `dapo`, `cispo`, `gspo`")
  clip_eps: float = F(0.2, "ratio clip (lower clip under `dapo`)")
  clip_eps_high: float = F(0.28, "`dapo`'s upper clip")
  cispo_eps_max: float = F(4.0, "`cispo`'s importance-weight cap")
  tis_threshold: float = F(
      2.0, "c, the sampler/trainer correction's bound (> 1); <= 0 disables "
      "([rl_algorithms.md](rl_algorithms.md#samplertrainer-correction-rltis_threshold-rlis_level-rlis_mode))")
  is_level: str = F("token", "the ratio π_trainer / π_sampler per `token` or per `sequence`")
  is_mode: str = F("truncate", "`truncate` (weight min(ρ, c)) or `mask` (weight ρ inside "
                   "[1/c, c], 0 outside)")
  is_sequence_ratio: str = F("product", "a sequence's ratio: the `product` of its token "
                             "ratios or their `geometric` mean")
  aggregation: str = F("token_mean", "`token_mean`, `sequence_mean`, `constant`, "
                       "`prompt_mean`")
  kl_coef: float = F(0.0, "KL penalty to the base model")
  kl_form: str = F("k3", "`k1`, `k2`, `k3`")
  log_kl_to_base: bool = F(True, "keep the base model to log `train/kl` even when "
                           "`kl_coef` = 0")
  entropy_coef: float = F(0.0, "entropy bonus (needs `kl_coef` > 0)")
  zero_variance_filter: str = F(
      "off", "groups whose rewards are all equal: `off`, `all` (left out of every loss "
      "term), `regularizers` (left out of the KL and entropy terms only)")
  num_minibatches: int = F(1, "optimizer updates per epoch; must divide B_p (whole groups; "
                                "rollouts under `per_problem` allocation)")
  num_epochs: int = F(1, "passes over each rollout batch")
  downsample: str = F("none", "PODS: `none`, `max_variance`, `max_reward`, `random`")
  train_rollouts_per_problem: int = F(0, "m; 0 = n")
  advantages_on: str = F("selected", "PODS advantages from the `selected` m or all "
                         "`generated` n")
  retire_pass_rate: float = F(0.0, "No-Positive-Resampling: retire problems whose "
                              "historical pass rate reaches this (ScaleRL: 0.9); 0 disables")
  overlong: str = F("reward", "what a truncated rollout earns: its verified `reward`, "
                    "`zero`, or `dapo` (the reward plus DAPO's soft penalty, linear from 0 "
                    "to -1 over the last `overlong_cache_tokens` tokens)")
  overlong_cache_tokens: int = F(0, "`dapo`: the soft-penalty window, 0 < this <= "
                                 "`max_new_tokens`")
  micro_batch_size: int = F(0, "rollouts per forward/backward pass of the update and the "
                            "log-prob passes; 0 = derived "
                            "([Memory](#memory-the-passes-of-a-step))")
  logprob_chunk_size: int = F(0, "response positions per LM-head chunk of the log-prob and "
                              "entropy passes; 0 = derived")
  length_buckets: int = F(
      0, "k > 0: the update's rows sorted by response length and each micro-batch cut to "
      "the shortest of T, T/2, ..., T/2^k response slots that holds it (the same loss to "
      "float rounding, less compute when most responses are short); 0 = every micro-batch "
      "at T ([performance.md](performance.md#the-update-cut-to-its-responses-rllength_buckets))")
  max_staleness: int = F(
      0, "k: rollouts may come from a policy up to k updates old, sampled ahead of the "
      "update; 0 = synchronous "
      "([rl_algorithms.md](rl_algorithms.md#off-policy-generation-rlmax_staleness))")
  off_policy: str = F(
      "pipeline", "the schedule when k > 0: `pipeline` (step s sampled by version s − k), "
      "`ppo_off_policy` (one version samples k successive steps) or `pipeline_in_flight` "
      "(free-running, weights switched within rollouts, stale batches dropped)")
  in_flight_tokens: int = F(16, "`pipeline_in_flight`: tokens decoded between reads of the "
                            "newest weights")
  dynamic_sampling: bool = F(
      False, "DAPO's dynamic sampling: further rounds of B_p problems until B_p groups have "
      "reward variance "
      "([rl_algorithms.md](rl_algorithms.md#dynamic-sampling-rldynamic_sampling))")
  dynamic_sampling_max_rounds: int = F(8, "the cap of sampling rounds per step, >= 1")
  allocation: str = F(
      "uniform", "`uniform`: n rollouts for every problem; `per_problem`: the step's B_p * n "
      "rollouts split among its problems by their estimated pass rates "
      "([rl_algorithms.md](rl_algorithms.md#per-problem-allocation-rlallocation))")
  allocation_n_min: int = F(2, "`per_problem`: the fewest rollouts a problem gets")
  allocation_n_max: int = F(0, "`per_problem`: the most rollouts a problem gets; 0 = 4 n")
  allocation_prior_mean: float = F(0.5, "`per_problem`: the pass-rate prior's mean, in "
                                   "(0, 1), for a problem without a profiled rate")
  allocation_prior_strength: float = F(2.0, "`per_problem`: the prior's weight, in "
                                       "pseudo-rollouts (> 0)")
  gamma: float = F(1.0, "GAE's discount (`advantage=gae`)")
  gae_lambda: float = F(1.0, "GAE's λ (`advantage=gae`)")

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
    validation.non_negative_int("rl.length_buckets", self.length_buckets, "0 = off")
    validation.boolean("rl.log_kl_to_base", self.log_kl_to_base)
    if not 0 <= self.retire_pass_rate <= 1:
      raise ValueError(f"rl.retire_pass_rate={self.retire_pass_rate}: expected in [0, 1]")
    validation.choice("rl.allocation", self.allocation, ALLOCATIONS)
    validation.positive_int("rl.allocation_n_min", self.allocation_n_min)
    validation.non_negative_int("rl.allocation_n_max", self.allocation_n_max, "0: 4 n")
    if not 0 < self.allocation_prior_mean < 1:
      raise ValueError(f"rl.allocation_prior_mean={self.allocation_prior_mean}: expected a "
                       "pass-rate prior in (0, 1)")
    if not self.allocation_prior_strength > 0:
      raise ValueError(f"rl.allocation_prior_strength={self.allocation_prior_strength}: "
                       "expected > 0 pseudo-rollouts")
    if self.entropy_coef and not self.kl_coef:
      raise ValueError("rl.entropy_coef > 0 needs rl.kl_coef > 0: entropy is never used "
                       "without the KL anchor (the IsoCompute easy recipe)")


  @property
  def uses_critic(self) -> bool:
    """PPO with a learned value function: GAE advantages from `config.critic`."""
    return self.advantage == names.GAE

  @property
  def keeps_reference(self) -> bool:
    """The base model's weights are kept beside the policy: for the KL penalty, or to
    log `train/kl` (`log_kl_to_base`)."""
    return self.kl_coef > 0 or self.log_kl_to_base

  @property
  def ratio_to_sampler(self) -> bool:
    """The losses' ratios take the sampler's log-probs as the old policy (off-policy runs)."""
    return self.max_staleness > 0

  @property
  def old_logp_known(self) -> bool:
    """Whether the policy before the update is the one the loss differentiates: a
    synchronous step of one epoch over one minibatch. Its old log-probs are then the
    pass's own log-probs (stop-gradient), so no separate pass computes them; the
    ratios are 1 and their gradient is the policy gradient, as with the separate pass."""
    return not self.max_staleness and self.num_epochs == 1 and self.num_minibatches == 1

  @property
  def updates_per_step(self) -> int:
    """Optimizer updates an RL step makes: one per minibatch per epoch."""
    return self.num_minibatches * self.num_epochs

  def train_rollouts(self, n: int) -> int:
    """m: rollouts per problem the update trains on (n unless PODS down-samples)."""
    return self.train_rollouts_per_problem or n

  @property
  def per_problem(self) -> bool:
    """Each problem's rollouts chosen from its estimated pass rate (unequal groups)."""
    return self.allocation == "per_problem"

  def group_bounds(self, n: int) -> tuple[int, int]:
    """(n_min, n_max) of a problem's rollouts under `per_problem` allocation."""
    return self.allocation_n_min, self.allocation_n_max or 4 * n

  def _check_per_problem(self, n: int) -> None:
    n_min, n_max = self.group_bounds(n)
    if n_min > n_max:
      raise ValueError(f"rl.allocation_n_min={n_min} is above rl.allocation_n_max={n_max}")
    if not n_min <= n <= n_max:
      raise ValueError(
          f"rollouts_per_problem={n} with rl.allocation='per_problem': the step's budget of "
          f"B_p * n rollouts must give every problem between rl.allocation_n_min={n_min} "
          f"and rl.allocation_n_max={n_max}")
    if n_min < 2 and self.advantage in GROUP_ESTIMATORS:
      raise ValueError(f"rl.allocation_n_min={n_min} with rl.advantage={self.advantage!r}: "
                       "group-normalised advantages need at least 2 rollouts per problem")
    if self.max_staleness and self.off_policy == "pipeline_in_flight":
      raise ValueError("rl.allocation='per_problem' with rl.off_policy='pipeline_in_flight': "
                       "not supported with groups of unequal size (in-flight sampling "
                       "refills its rows a rollout at a time); use rl.off_policy='pipeline' "
                       "or rl.allocation='uniform'")

  def check_allocation(self, n: int, problems_per_batch: int, max_new_tokens: int) -> None:
    """The rules that tie these fields to n, B_p and the sampler's max_new_tokens."""
    m, b_p = self.train_rollouts(n), problems_per_batch
    if self.per_problem:
      self._check_per_problem(n)
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
  """`config.critic`: PPO's value model (`isojax.rl.critic`), built when `rl.advantage` is
  `gae`: a scalar value head on a decoder of its own or on the policy's trunk
  ([rl_algorithms.md](rl_algorithms.md#ppo-with-a-critic-rladvantagegae-configcritic))."""
  trunk: str = F("own", "`own`: a decoder of its own; `policy`: a value head on the "
                 "policy's trunk (needs `train_trunk=False`, no `path`)")
  path: str = F("", "`\"\"`: initialised from the policy's weights; else a checkpoint "
                "directory with the policy's vocabulary")
  train_trunk: bool = F(True, "False: only the value head learns")
  learning_rate: float = F(1e-4, "its own AdamW (the rest of `optim` as the policy's)")
  warmup_steps: int = F(0, "RL steps at the start that train the critic alone")
  value_clip: float = F(0.2, "PPO value clipping around the values before the update; "
                        "0 = off")

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
  learning_rate: float = F(1e-4, "peak LR at `lr_reference_batch`")
  lr_reference_batch: int = F(128, "B_ref, in trained rollouts")
  lr_scaling: str = F("sqrt", "how the LR follows the trained batch B: `constant`, `sqrt` "
                      "or `linear` in B / B_ref")
  warmup_steps: int = F(10, "linear warm-up, in steps")
  warmup_rollouts: int = F(0, "linear warm-up counted in sampled rollouts instead (B_p * n "
                           "a step, rounded up to whole steps), so every allocation of a "
                           "sweep warms up on the same compute; needs warmup_steps=0")
  weight_decay: float = F(0.0, "AdamW decay")
  b1: float = F(0.9, "AdamW's first moment decay")
  b2: float = F(0.99, "AdamW's second moment decay")
  grad_clip_norm: float = F(1.0, "global-norm clip; 0 disables")
  frozen: tuple[str, ...] = F((), "policy parameters left unchanged: each entry a path "
                              "prefix such as `embed` or `layers/attn` (each must match a "
                              "trained parameter; their optimizer moments stay zero)")

  def __post_init__(self):
    frozen = tuple(self.frozen) if isinstance(self.frozen, (list, tuple)) else None
    if frozen is None or not all(isinstance(p, str) and p.strip("/") for p in frozen):
      raise ValueError(f"optim.frozen={self.frozen!r}: expected a tuple of parameter path "
                       "prefixes such as ('embed',)")
    object.__setattr__(self, "frozen", tuple(p.strip("/") for p in frozen))
    validation.choice("optim.lr_scaling", self.lr_scaling, LR_SCALING_RULES)
    validation.positive_int("optim.lr_reference_batch", self.lr_reference_batch)
    validation.non_negative_int("optim.warmup_steps", self.warmup_steps, "0: no warm-up")
    validation.non_negative_int("optim.warmup_rollouts", self.warmup_rollouts,
                                "0: the warm-up is optim.warmup_steps")
    if self.warmup_steps and self.warmup_rollouts:
      raise ValueError(f"optim.warmup_steps={self.warmup_steps} and optim.warmup_rollouts="
                       f"{self.warmup_rollouts}: set one (warmup_steps=0 to count the "
                       "warm-up in rollouts)")
    if not self.learning_rate > 0:
      raise ValueError(f"optim.learning_rate={self.learning_rate}: expected > 0")


  def warmup(self, rollouts_per_step: int) -> int:
    """The warm-up in RL steps at `rollouts_per_step` sampled rollouts a step."""
    return self.warmup_steps or -(-self.warmup_rollouts // rollouts_per_step)

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


@dataclasses.dataclass(frozen=True)
class GuardSettings(validation.Section):
  """`config.guard`: the divergence guard (`isojax.rl.guard`). A non-finite loss, gradient
  or parameter always stops the run before it is checkpointed; these fields set what a
  collapse (zero reward and zero gradient norm, step after step) does."""
  collapse_steps: int = F(5, "zero reward and zero gradient norm this many steps in a row "
                          "logs a `collapse` event; 0 disables")
  stop_on_collapse: bool = F(False, "stop the run on a collapse (needs `collapse_steps` > "
                             "0); the message names the checkpoint kept from before it and "
                             "the rerun that goes back to it")

  def __post_init__(self):
    steps = validation.non_negative_int("guard.collapse_steps", self.collapse_steps,
                                        "0 disables the collapse detector")
    validation.boolean("guard.stop_on_collapse", self.stop_on_collapse)
    if self.stop_on_collapse and not steps:
      raise ValueError("guard.stop_on_collapse=True needs guard.collapse_steps > 0")
