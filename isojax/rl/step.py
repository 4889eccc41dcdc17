"""One RL step after sampling: score -> assemble the batch -> update; and its metrics.

`train.run` takes each step's rollouts from its source (`rl/sources.py`: synchronous,
dynamic sampling, pipelined or in flight; they sample with `rollout.sample`), hands the
pending rollouts to `Learner.step` and logs `step_metrics`. Without PODS every rollout is trained on, so the old- and
reference-log-prob passes are dispatched to the devices *before* waiting on the
verifier (`Learner.prefetch`), and the host grades while the devices score.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from isojax import metrics
from isojax.models import lora as lora_lib
from isojax.models import sharding
from isojax.rl import batch as rl_batch
from isojax.rl import critic as critic_lib
from isojax.rl import optimizer, rollout, update
from isojax.rl import settings as rl_settings
from isojax.sampling import settings as sampling_settings


@dataclasses.dataclass
class PolicyArrays:
  """What the update holds of the policy: the state it trains, LoRA's frozen base, the
  optimizer state and the KL reference."""
  trained: Any    # every parameter, or LoRA's adapters: what the optimizer updates
  frozen: Any     # LoRA's base weights, read and never donated (None without LoRA)
  opt_state: Any  # of `trained`, each moment beside its parameter
  reference: Any  # the base policy: a copy of the weights, or with LoRA the base itself
                  # with zero adapters; None when `RLSettings.keeps_reference` is false


def policy_arrays(params, tx: optax.GradientTransformation, mesh: Mesh, *, lora: bool,
                  keeps_reference: bool, abstract: bool = False) -> PolicyArrays:
  """The update's arrays for the policy `params`, as a run builds them (`train.run`).

  With `abstract` the parameters are placed `jax.ShapeDtypeStruct`s and so is every
  array returned (`launch.aot` compiles a pod's step against them): the reference is
  then the parameters' shapes, as a copy (or the LoRA base with zero adapters) has them.
  """
  trained, frozen = lora_lib.trained_and_frozen(params, enabled=lora)
  opt_state = optimizer.init_optimizer(tx, trained, optimizer.opt_state_shardings(tx, trained, mesh),
                                    abstract=abstract)
  reference = None
  if keeps_reference:
    reference = (params if abstract else lora_lib.disabled(params) if lora
                 else jax.tree.map(jnp.copy, params))
  return PolicyArrays(trained, frozen, opt_state, reference)


@dataclasses.dataclass
class StepResult:
  scored: rollout.ScoredRollouts
  zero_variance_G: np.ndarray   # [G] bool, trained groups whose rewards are all equal
  stats: dict[str, float]       # the update's statistics (see update.train_step)


@dataclasses.dataclass
class Learner:
  """The policy being trained and everything its update needs; mutated by `step`."""
  rl: rl_settings.RLSettings
  sampling: sampling_settings.SamplingSettings
  rollouts_per_problem: int  # n
  lora: bool            # the trained state is the LoRA adapters (`model.lora.rank` > 0)
  mesh: Mesh
  graphdef: Any
  params: Any           # the whole policy (with LoRA: its adapters and the frozen base)
  opt_state: Any        # of the trained state: every parameter, or the adapters
  ref_params: Any       # None when neither rl.kl_coef nor rl.log_kl_to_base needs it
  tx: optax.GradientTransformation
  critic: critic_lib.Critic | None = None  # PPO's value model (rl.advantage == "gae")
  trained_rows: int = 0  # B_p * m: the update's rows (unequal groups are padded to it)

  @functools.cached_property
  def settings(self) -> update.UpdateSettings:
    return update.UpdateSettings.derive(
        self.rl, self.sampling, group_size=self.rl.train_rollouts(self.rollouts_per_problem),
        prompt_len=0)

  def log_probs(self, tokens_BS, mask_BS, prompt_len: int, sampler_logp_BT=None):
    """(old, reference) log-probs [B, T] of the responses, dispatched asynchronously.

    The old log-probs are the trainer's before this update, `sampler_logp_BT` itself
    when the ratios are taken against the sampler (`RLSettings.ratio_to_sampler`), or
    None when the update computes them in its own pass
    (`UpdateSettings.old_logp_in_pass`); the reference log-probs are the base model's,
    or the old ones when no reference is kept.
    """
    s = self.settings
    score = functools.partial(update.score, prompt_len=prompt_len, temperature=s.temperature,
                              micro_batch_size=s.micro_batch_size,
                              chunk_size=s.logprob_chunk_size,
                              length_buckets=s.length_buckets)
    with jax.set_mesh(self.mesh):
      old_logp = (sampler_logp_BT if self.rl.ratio_to_sampler
                  else None if s.old_logp_in_pass
                  else score(self.graphdef, self.params, tokens_BS, mask_BS))
      ref_logp = old_logp if self.ref_params is None else score(
          self.graphdef, self.ref_params, tokens_BS, mask_BS)
    return old_logp, ref_logp

  def prefetch(self, pending: rollout.Pending):
    """Log-probs of every rollout while grades compute (None under PODS: the trained
    subset depends on the rewards)."""
    if self.rl.downsample != "none":
      return None
    tokens, mask = rollout.sequences(pending, self.rollouts_per_problem)
    return self.log_probs(*sharding.shard_batch((tokens, mask), self.mesh),
                          pending.prompt_len)

  def step(self, scored: rollout.ScoredRollouts, *, select_rng: jax.Array,
           shuffle_rng: jax.Array, prefetched=None, train_policy: bool = True) -> StepResult:
    """Advantages, PODS and masks (rl/batch.py), log-probs, then one train_step; with a
    critic, GAE advantages from its values first and its own update after.

    `train_policy` False (the critic's warm-up) computes the policy's loss and stats but
    leaves the policy and its optimizer as they are.
    """
    batch, zero_var_G = rl_batch.build_train_batch(
        self.rl, scored, max_new_tokens=self.sampling.max_new_tokens, select_rng=select_rng,
        trained_rows=self.trained_rows)
    batch = sharding.shard_batch(batch, self.mesh)
    old_logp, ref_logp = prefetched or self.log_probs(batch.tokens, batch.mask,
                                                      scored.prompt_len, batch.sampler_logp)
    batch = batch.replace(old_logp=old_logp, ref_logp=ref_logp, shuffle_rng=shuffle_rng)
    settings = dataclasses.replace(self.settings, prompt_len=scored.prompt_len,
                                   frozen=not train_policy)
    critic_stats = {}
    with jax.set_mesh(self.mesh):  # activations pinned to their logical axes
      if self.critic is not None:
        targets = self.critic.targets(batch, scored.prompt_len, self.params)
        batch = batch.replace(advantages=targets.advantages)
        update_critic = functools.partial(
            self.critic.update, targets, jax.random.fold_in(shuffle_rng, 1),
            scored.prompt_len)
        if self.critic.shares_policy_trunk:  # on the trunk its old values were read from,
          critic_stats = update_critic(self.params)  # before the policy's update donates it
      trained, frozen = lora_lib.trained_and_frozen(self.params, enabled=self.lora)
      trained, self.opt_state, stats = update.train_step(
          self.graphdef, trained, self.opt_state, batch, tx=self.tx, settings=settings,
          frozen=frozen)
      self.params = lora_lib.whole(trained, frozen)
      if self.critic is not None and not self.critic.shares_policy_trunk:
        critic_stats = update_critic()
    return StepResult(scored, zero_var_G, jax.device_get(dict(stats, **critic_stats)))


def step_metrics(rl: rl_settings.RLSettings, sampling: sampling_settings.SamplingSettings,
                 result: StepResult, *,
                 learning_rate: float, active_problems: int,
                 has_reference: bool) -> dict[str, float]:
  """The `train/...` metrics of one step."""
  scored, stats = result.scored, dict(result.stats)
  rollouts = scored.rewards_B.size
  values = {
      metrics.TRAIN_REWARD: float(scored.rewards_B.mean()),
      metrics.TRAIN_LOSS: float(stats.pop("loss")),
      metrics.TRAIN_CLIP_FRACTION: float(stats.pop("clip_fraction")),
      metrics.TRAIN_GRAD_NORM: float(stats.pop("grad_norm")),
      metrics.TRAIN_LR: float(learning_rate),
      metrics.TRAIN_ZERO_VARIANCE: float(result.zero_variance_G.mean()),
      metrics.TRAIN_RESPONSE_LENGTH: scored.num_tokens / rollouts,
      metrics.TRAIN_ACTIVE_PROBLEMS: active_problems,
      metrics.TRAIN_TRUNCATED: scored.truncated_fraction,
      metrics.TRAIN_VERIFIER_TIMEOUTS: scored.verifier_timeouts,
      metrics.TRAIN_VERIFIER_ERRORS: scored.verifier_errors,
  }
  if scored.group_sizes is not None:
    values[metrics.TRAIN_GROUP_SIZES] = [int(k) for k in scored.group_sizes]
  if sampling.think_budget:
    values[metrics.TRAIN_INTERRUPTED] = float(np.mean(scored.rollouts.interrupted))
  if rl.overlong != "reward":
    shaped_GN = rl_batch.training_rewards(rl, scored, max_new_tokens=sampling.max_new_tokens)
    valid_GN = scored.valid_GN
    values[metrics.TRAIN_SHAPED_REWARD] = float(
        shaped_GN.mean() if valid_GN is None else shaped_GN[valid_GN].mean())
  # Entropy and KL are absent when neither a coefficient nor a logged metric needs them.
  if "entropy" in stats:
    values[metrics.TRAIN_ENTROPY] = float(stats.pop("entropy"))
  kl = stats.pop("kl", None)
  if has_reference and kl is not None:
    values[metrics.TRAIN_KL] = float(kl)
  values.update({f"train/{k}": float(v) for k, v in stats.items()})
  return values
