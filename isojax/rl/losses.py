"""Policy losses, loss aggregation, KL and entropy regularisers, and IS corrections.

The recipes isojax implements (GRPO, DAPO, Dr.GRPO, GSPO, ScaleRL's CISPO) differ
in a few small formulas: the per-token surrogate, how token losses are averaged, and
which regularisers are added. Each is a pure function registered by name
(`config.rl.policy_loss`, `config.rl.aggregation`, `config.rl.kl_form`), so the jitted
update step composes them without branching on recipes:

  loss_BT, stats = policy_loss(name, logp_BT=..., old_logp_BT=..., advantages_B=...,
                               mask_BT=...)
  loss = aggregate(aggregation, loss_BT * tis_weights_BT, mask_BT, group_size=n)

B = G * N sequences (groups of N consecutive rollouts of one problem), T tokens.
Per-token losses are to be minimised and are exactly zero where `mask_BT` is 0; the
log-ratio is zeroed there before `exp`, so padding cannot produce inf or NaN in values
or gradients.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from isojax.rl import settings as rl_settings

sg = jax.lax.stop_gradient


def _masked_mean(x_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  return jnp.sum(jnp.where(mask_BT, x_BT, 0)) / jnp.maximum(jnp.sum(mask_BT), 1)


def _masked_max(x_BT: jax.Array, mask_BT: jax.Array, empty: float) -> jax.Array:
  out = jnp.max(jnp.where(mask_BT, x_BT, -jnp.inf))
  return jnp.where(jnp.any(mask_BT), out, empty)


def _masked_min(x_BT: jax.Array, mask_BT: jax.Array, empty: float) -> jax.Array:
  out = jnp.min(jnp.where(mask_BT, x_BT, jnp.inf))
  return jnp.where(jnp.any(mask_BT), out, empty)


# --------------------------------------------------------------------------------
# Policy losses. Each returns (loss_BT, clipped_BT, ratio_BT): the per-token loss
# (not yet masked), where the clip or truncation is active, and the ratio it uses.
# --------------------------------------------------------------------------------


def _clipped_surrogate(ratio_BT, adv_B1, low, high):
  """-min(ratio * A, clip(ratio, 1 - low, 1 + high) * A) and where the clip binds."""
  unclipped_BT = ratio_BT * adv_B1
  clipped_BT = jnp.clip(ratio_BT, 1.0 - low, 1.0 + high) * adv_B1
  # The clipped term is chosen and differs: the token gets no gradient.
  active_BT = clipped_BT < unclipped_BT
  return -jnp.minimum(unclipped_BT, clipped_BT), active_BT


def ppo_clip(logp_BT, old_logp_BT, advantages_BT, mask_BT, *, clip_eps, clip_eps_high,
             cispo_eps_max):
  """GRPO's PPO-clip on the token ratio pi_theta / pi_old, symmetric eps."""
  del clip_eps_high, cispo_eps_max
  ratio_BT = jnp.exp(jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0))
  loss_BT, active_BT = _clipped_surrogate(ratio_BT, advantages_BT, clip_eps, clip_eps)
  return loss_BT, active_BT, ratio_BT


def dapo(logp_BT, old_logp_BT, advantages_BT, mask_BT, *, clip_eps, clip_eps_high,
         cispo_eps_max):
  """DAPO's clip-higher: ratio clipped to [1 - clip_eps, 1 + clip_eps_high]."""
  del cispo_eps_max
  ratio_BT = jnp.exp(jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0))
  loss_BT, active_BT = _clipped_surrogate(ratio_BT, advantages_BT, clip_eps, clip_eps_high)
  return loss_BT, active_BT, ratio_BT


def cispo(logp_BT, old_logp_BT, advantages_BT, mask_BT, *, clip_eps, clip_eps_high,
          cispo_eps_max):
  """ScaleRL's CISPO: -sg(min(ratio, eps_max)) * A * logp.

  Unlike PPO-clip every token keeps a gradient; only the IS weight is truncated. The
  value is a surrogate (its gradient is the CISPO gradient), not an objective estimate.
  """
  del clip_eps, clip_eps_high
  ratio_BT = jnp.exp(jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0))
  weight_BT = sg(jnp.minimum(ratio_BT, cispo_eps_max))
  loss_BT = -weight_BT * advantages_BT * logp_BT
  return loss_BT, ratio_BT > cispo_eps_max, ratio_BT


def gspo(logp_BT, old_logp_BT, advantages_BT, mask_BT, *, clip_eps, clip_eps_high,
         cispo_eps_max):
  """GSPO in its GSPO-token form, clipped with symmetric `clip_eps`.

  Sequence ratio s_i = exp(mean over valid tokens of (logp - old_logp)), the
  length-normalised likelihood ratio. Every valid token t of sequence i carries
  s_it = sg(s_i) * exp(logp_it - sg(logp_it)), whose value is s_i and whose gradient
  is s_i * grad logp_it, and the loss -min(s_it * A_i, clip(s_it) * A_i). So every
  token holds the whole sequence objective, and `sequence_mean` aggregation gives the
  GSPO objective mean_i -min(s_i A_i, clip(s_i) A_i) exactly, in value and gradient
  (grad s_i = s_i * mean_t grad logp_it). Pair it with `sequence_mean`; the GSPO
  paper uses a much smaller clip range (3e-4 / 4e-4) than PPO's 0.2.
  """
  del clip_eps_high, cispo_eps_max
  mask_f = mask_BT.astype(logp_BT.dtype)
  log_ratio_BT = jnp.where(mask_BT, logp_BT - old_logp_BT, 0.0)
  seq_log_ratio_B = jnp.sum(log_ratio_BT * mask_f, axis=1) / jnp.maximum(
      jnp.sum(mask_f, axis=1), 1)
  seq_ratio_B1 = jnp.exp(seq_log_ratio_B)[:, None]
  ratio_BT = sg(seq_ratio_B1) * jnp.exp(logp_BT - sg(logp_BT))
  loss_BT, active_BT = _clipped_surrogate(ratio_BT, advantages_BT, clip_eps, clip_eps)
  return loss_BT, active_BT, ratio_BT


POLICY_LOSSES: dict[str, Callable[..., tuple[jax.Array, jax.Array, jax.Array]]] = {
    "ppo_clip": ppo_clip,
    "dapo": dapo,
    "cispo": cispo,
    "gspo": gspo,
}


def policy_loss(name: str, *, logp_BT: jax.Array, old_logp_BT: jax.Array,
                advantages_B: jax.Array, mask_BT: jax.Array, clip_eps: float,
                clip_eps_high: float, cispo_eps_max: float
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-token loss [B, T] to minimise (0 where mask is 0) and scalar diagnostics.

  `advantages_B` holds one advantage per sequence [B] (the group estimators) or one per
  token [B, T] (GAE).

  stats (over valid tokens, stop-gradient):
    clip_fraction  fraction of tokens where the clip (PPO, DAPO, GSPO) or the IS
                   truncation (CISPO: ratio > cispo_eps_max) is active
    ratio_mean, ratio_max, ratio_min   of the ratio the loss uses: the token ratio,
                   or for GSPO the sequence ratio s_i on each of its tokens
  With no valid token, clip_fraction is 0 and the ratio statistics are 1.
  """
  if name not in POLICY_LOSSES:
    raise ValueError(f"policy loss {name!r}: expected one of {sorted(POLICY_LOSSES)}")
  if logp_BT.shape != old_logp_BT.shape or logp_BT.shape != mask_BT.shape:
    raise ValueError(
        f"logp_BT {logp_BT.shape}, old_logp_BT {old_logp_BT.shape} and mask_BT "
        f"{mask_BT.shape} must have the same [B, T] shape")
  if advantages_B.shape not in (logp_BT.shape[:1], logp_BT.shape):
    raise ValueError(f"advantages_B has shape {advantages_B.shape}: expected "
                     f"[{logp_BT.shape[0]}] (one per sequence) or {list(logp_BT.shape)} "
                     "(one per token, GAE)")
  advantages_BT = jnp.broadcast_to(
      advantages_B[:, None] if advantages_B.ndim == 1 else advantages_B, logp_BT.shape)
  valid_BT = mask_BT.astype(bool)
  # Padding may hold any log-prob (even -inf); zero it so no inf/NaN reaches the
  # value or the gradient of valid tokens.
  logp_BT = jnp.where(valid_BT, logp_BT, 0.0)
  old_logp_BT = jnp.where(valid_BT, old_logp_BT, 0.0)
  loss_BT, active_BT, ratio_BT = POLICY_LOSSES[name](
      logp_BT, old_logp_BT, advantages_BT, valid_BT, clip_eps=clip_eps,
      clip_eps_high=clip_eps_high, cispo_eps_max=cispo_eps_max)
  loss_BT = jnp.where(valid_BT, loss_BT, 0.0)
  ratio_BT = sg(ratio_BT)
  stats = {
      "clip_fraction": _masked_mean(active_BT.astype(jnp.float32), valid_BT),
      "ratio_mean": jnp.where(jnp.any(valid_BT), _masked_mean(ratio_BT, valid_BT), 1.0),
      "ratio_max": _masked_max(ratio_BT, valid_BT, 1.0),
      "ratio_min": _masked_min(ratio_BT, valid_BT, 1.0),
  }
  return loss_BT, stats


# --------------------------------------------------------------------------------
# Aggregation: per-token losses [B, T] -> the scalar to minimise.
# --------------------------------------------------------------------------------


def token_mean(loss_BT, mask_f, *, group_size, constant_normalizer, group_ids_B=None):
  """DAPO / GRPO-as-implemented: every valid token of the batch weighs the same."""
  del group_size, constant_normalizer, group_ids_B
  return jnp.sum(loss_BT * mask_f) / jnp.maximum(jnp.sum(mask_f), 1)


def sequence_mean(loss_BT, mask_f, *, group_size, constant_normalizer, group_ids_B=None):
  """Original GRPO: the mean over sequences of each sequence's token mean.

  Sequences with no valid token (for example filtered out through the mask) are left
  out of the mean instead of diluting it.
  """
  del group_size, constant_normalizer, group_ids_B
  len_B = jnp.sum(mask_f, axis=1)
  seq_B = jnp.sum(loss_BT * mask_f, axis=1) / jnp.maximum(len_B, 1)
  return jnp.sum(seq_B) / jnp.maximum(jnp.sum(len_B > 0), 1)


def constant(loss_BT, mask_f, *, group_size, constant_normalizer, group_ids_B=None):
  """Dr.GRPO: token sum over B * constant_normalizer (e.g. the max response length),
  so the weight of a token does not depend on the lengths in its batch."""
  del group_size, group_ids_B
  if constant_normalizer is None or not constant_normalizer > 0:
    raise ValueError(
        f"aggregation 'constant' needs constant_normalizer > 0 (for example the "
        f"maximum response length), got {constant_normalizer!r}")
  return jnp.sum(loss_BT * mask_f) / (loss_BT.shape[0] * constant_normalizer)


def prompt_mean(loss_BT, mask_f, *, group_size, constant_normalizer, group_ids_B=None):
  """ScaleRL prompt level: each group sums its token losses over its own token count,
  then groups are averaged, so every prompt weighs the same. Groups with no valid token
  are left out of the mean.

  A group is `group_size` consecutive sequences, or, with `group_ids_B` [B] (groups of
  unequal size: per-problem allocation), the rows that share an id in [0, B).
  """
  del constant_normalizer
  b, t = loss_BT.shape
  if group_ids_B is not None:
    sum_G = jax.ops.segment_sum(jnp.sum(loss_BT * mask_f, axis=1), group_ids_B,
                                num_segments=b)
    count_G = jax.ops.segment_sum(jnp.sum(mask_f, axis=1), group_ids_B, num_segments=b)
    group_G = sum_G / jnp.maximum(count_G, 1)
    return jnp.sum(group_G) / jnp.maximum(jnp.sum(count_G > 0), 1)
  if b % group_size:
    raise ValueError(f"aggregation 'prompt_mean': B={b} sequences is not a multiple of "
                     f"group_size={group_size}")
  # [G, group_size * T]: each group's token losses in one row.
  loss_rows = (loss_BT * mask_f).reshape(b // group_size, group_size * t)
  count_G = mask_f.reshape(b // group_size, group_size * t).sum(axis=1)
  group_G = loss_rows.sum(axis=1) / jnp.maximum(count_G, 1)
  return jnp.sum(group_G) / jnp.maximum(jnp.sum(count_G > 0), 1)


AGGREGATIONS: dict[str, Callable[..., jax.Array]] = {
    "token_mean": token_mean,
    "sequence_mean": sequence_mean,
    "constant": constant,
    "prompt_mean": prompt_mean,
}


def aggregate(name: str, loss_BT: jax.Array, mask_BT: jax.Array, *, group_size: int,
              constant_normalizer: float | None = None,
              group_ids_B: jax.Array | None = None) -> jax.Array:
  """The scalar loss from per-token losses [B, T]; only tokens with mask 1 count.
  `group_ids_B`: each row's group when groups differ in size (else consecutive groups
  of `group_size`)."""
  if name not in AGGREGATIONS:
    raise ValueError(f"aggregation {name!r}: expected one of {sorted(AGGREGATIONS)}")
  if loss_BT.shape != mask_BT.shape or loss_BT.ndim != 2:
    raise ValueError(f"loss_BT {loss_BT.shape} and mask_BT {mask_BT.shape} must have the "
                     "same [B, T] shape")
  if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) \
      or group_size < 1:
    raise ValueError(f"group_size={group_size!r}: expected a positive int")
  group_size = int(group_size)
  mask_f = mask_BT.astype(loss_BT.dtype)
  loss_BT = jnp.where(mask_BT.astype(bool), loss_BT, 0.0)
  return AGGREGATIONS[name](loss_BT, mask_f, group_size=group_size,
                            constant_normalizer=constant_normalizer, group_ids_B=group_ids_B)


def aggregation_weights(name: str, mask_BT: jax.Array, *, group_size: int,
                        constant_normalizer: float | None = None,
                        group_ids_B: jax.Array | None = None) -> jax.Array:
  """Per-token weights w [B, T] with aggregate(name, x, mask) == sum(w * x) for every x.

  Every aggregation is linear in the token losses, with coefficients that depend on
  the mask only; so the weights are its gradient (taken at 0, the same anywhere).
  Gradient accumulation needs them: a micro-batch's rows contribute sum(w * x) with
  the normalisers (token, sequence and group counts) of the whole minibatch, and the
  micro-batch terms add up to the minibatch loss whatever rows each one holds.
  """
  zeros_BT = jnp.zeros(mask_BT.shape, jnp.float32)
  return sg(jax.grad(lambda x_BT: aggregate(
      name, x_BT, mask_BT, group_size=group_size, constant_normalizer=constant_normalizer,
      group_ids_B=group_ids_B))(zeros_BT))


# --------------------------------------------------------------------------------
# Regularisers and the sampler/trainer importance correction.
# --------------------------------------------------------------------------------


def _k1(log_ratio_BT):
  return log_ratio_BT


def _k2(log_ratio_BT):
  return 0.5 * jnp.square(log_ratio_BT)


def _k3(log_ratio_BT):
  # exp(ref - logp) - (ref - logp) - 1 with ref - logp = -log_ratio: unbiased and >= 0.
  return jnp.expm1(-log_ratio_BT) + log_ratio_BT


KL_ESTIMATORS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "k1": _k1, "k2": _k2, "k3": _k3,
}


def kl_penalty(form: str, logp_BT: jax.Array, ref_logp_BT: jax.Array) -> jax.Array:
  """Per-token estimate [B, T] of KL(pi_theta || pi_ref) from tokens sampled from
  pi_theta (Schulman's k1, k2, k3). Mask and aggregate it like a loss."""
  if form not in KL_ESTIMATORS:
    raise ValueError(f"kl form {form!r}: expected one of {sorted(KL_ESTIMATORS)}")
  return KL_ESTIMATORS[form](logp_BT - ref_logp_BT)


def token_entropy(logits_BTV: jax.Array) -> jax.Array:
  """Entropy [B, T] float32 of the full next-token distribution.

  Computed from log_softmax in float32; logits of -inf (masked vocabulary entries)
  contribute 0 to the value and the gradient.
  """
  logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  finite_BTV = jnp.isfinite(logp_BTV)
  safe_logp_BTV = jnp.where(finite_BTV, logp_BTV, 0.0)
  p_BTV = jnp.where(finite_BTV, jnp.exp(safe_logp_BTV), 0.0)
  return -jnp.sum(p_BTV * safe_logp_BTV, axis=-1)


def importance_weights(trainer_logp_BT: jax.Array, sampler_logp_BT: jax.Array,
                       mask_BT: jax.Array, threshold: float | None, *, level: str = "token",
                       mode: str = "truncate", sequence_ratio: str = "product",
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Stop-gradient weights [B, T] correcting the sampler/trainer mismatch, and its stats.

  The ratio rho = pi_trainer / pi_sampler is taken per token (`level="token"`) or per
  sequence (`"sequence"`: the product of its token ratios, or their geometric mean with
  `sequence_ratio="geometric"`, carried by each of its tokens). `mode="truncate"` (TIS)
  weighs by min(rho, c); `mode="mask"` (masked IS) weighs by rho where 1/c <= rho <= c
  and drops the token or sequence (weight 0) elsewhere. c = `threshold`; None or <= 0
  disables the correction (every weight 1) and the statistics are computed either way.
  Weights are 1 where mask is 0. The caller multiplies the per-token loss by them.

  stats: tis/mean_weight (over valid tokens); tis/truncated_fraction and
  tis/masked_fraction (of valid tokens at token level, of sequences with a valid token
  at sequence level; 0 unless that mode is on); tis/max_abs_logp_diff and
  tis/mean_abs_logp_diff (|log pi_trainer - log pi_sampler| over valid tokens);
  tis/sequence_kl (KL(pi_sampler || pi_trainer) of a sequence, the k3 estimate summed
  over its tokens, averaged over sequences with a valid token).
  """
  if trainer_logp_BT.shape != sampler_logp_BT.shape or trainer_logp_BT.shape != mask_BT.shape:
    raise ValueError(
        f"trainer_logp_BT {trainer_logp_BT.shape}, sampler_logp_BT "
        f"{sampler_logp_BT.shape} and mask_BT {mask_BT.shape} must have the same shape")
  for field, value, choices in (("is_level", level, rl_settings.IS_LEVELS),
                                ("is_mode", mode, rl_settings.IS_MODES),
                                ("is_sequence_ratio", sequence_ratio,
                                 rl_settings.IS_SEQUENCE_RATIOS)):
    if value not in choices:
      raise ValueError(f"rl.{field}={value!r}: expected one of {choices}")
  valid_BT = mask_BT.astype(bool)
  diff_BT = sg(jnp.where(valid_BT, trainer_logp_BT - sampler_logp_BT, 0.0))
  has_token_B = jnp.any(valid_BT, axis=1)
  if level == "token":
    log_ratio_BT, unit_BT = diff_BT, valid_BT
  else:
    log_ratio_B = jnp.sum(diff_BT, axis=1)
    if sequence_ratio == "geometric":
      log_ratio_B = log_ratio_B / jnp.maximum(jnp.sum(valid_BT, axis=1), 1)
    log_ratio_BT = jnp.broadcast_to(log_ratio_B[:, None], diff_BT.shape)
    unit_BT = has_token_B[:, None]  # one unit per sequence: its first column
    unit_BT = unit_BT & (jnp.arange(diff_BT.shape[1]) == 0)[None, :]
  # Capped in log space: a long sequence's product of ratios may overflow float32.
  ratio_BT = jnp.exp(jnp.minimum(log_ratio_BT, 80.0))
  if threshold is None:
    enabled = jnp.asarray(False)
    threshold = 1.0
  else:
    enabled = jnp.asarray(threshold) > 0
  if mode == "truncate":
    weights_BT = jnp.where(enabled, jnp.minimum(ratio_BT, threshold), 1.0)
    truncated_BT = enabled & (ratio_BT > threshold)
    masked_BT = jnp.zeros(ratio_BT.shape, bool)
  else:
    inside_BT = (ratio_BT >= 1.0 / threshold) & (ratio_BT <= threshold)
    weights_BT = jnp.where(enabled, jnp.where(inside_BT, ratio_BT, 0.0), 1.0)
    truncated_BT = jnp.zeros(ratio_BT.shape, bool)
    masked_BT = enabled & ~inside_BT
  weights_BT = jnp.where(valid_BT, weights_BT, 1.0)
  abs_diff_BT = jnp.abs(diff_BT)
  # k3 of KL(sampler || trainer) from the sampler's tokens: rho - 1 - log rho per token.
  seq_kl_B = jnp.sum(jnp.expm1(diff_BT) - diff_BT, axis=1)
  stats = {
      "tis/mean_weight": jnp.where(jnp.any(valid_BT), _masked_mean(weights_BT, valid_BT), 1.0),
      "tis/truncated_fraction": _masked_mean(truncated_BT.astype(jnp.float32), unit_BT),
      "tis/masked_fraction": _masked_mean(masked_BT.astype(jnp.float32), unit_BT),
      "tis/max_abs_logp_diff": _masked_max(abs_diff_BT, valid_BT, 0.0),
      "tis/mean_abs_logp_diff": _masked_mean(abs_diff_BT, valid_BT),
      "tis/sequence_kl": _masked_mean(seq_kl_B, has_token_B),
  }
  return weights_BT, stats
