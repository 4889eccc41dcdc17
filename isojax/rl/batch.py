"""RL batch assembly: verified rewards -> shaped rewards -> advantages -> a TrainBatch.

Everything between "the verifier graded B = G * n rollouts" and "the update consumes a
batch" is here, as host-side NumPy/JAX on small arrays: the overlong-response rule
(`rl.overlong`), advantages, PODS down-sampling (n -> m per group) and the zero-variance
masks. The training loop calls `build_train_batch` once per step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from isojax.rl import advantages as advantages_lib
from isojax.rl import downsampling, names, rollout, update
from isojax.rl import settings as rl_settings


def dapo_overlong_penalty(lengths_B: np.ndarray, max_new_tokens: int,
                          cache_tokens: int) -> np.ndarray:
  """DAPO's soft overlong punishment, in [-1, 0] (Yu et al. 2025, eq. 13).

  0 up to max_new_tokens - cache_tokens tokens, then linear down to -1 at
  max_new_tokens (where a rollout that never stopped ends).
  """
  start = max_new_tokens - cache_tokens
  over = np.asarray(lengths_B, np.float32) - start
  return -np.clip(over / cache_tokens, 0.0, 1.0)


def shape_rewards(mode: str, rewards_B: np.ndarray, lengths_B: np.ndarray,
                  finished_B: np.ndarray, *, max_new_tokens: int,
                  cache_tokens: int = 0) -> np.ndarray:
  """What each rollout earns under `rl.overlong` (one of `rl.settings.OVERLONG_MODES`,
  checked by `RLSettings`); truncated = not finished."""
  rewards_B = np.asarray(rewards_B, np.float32)
  shaped = {
      "reward": lambda: rewards_B,
      "zero": lambda: np.where(finished_B, rewards_B, 0.0).astype(np.float32),
      "dapo": lambda: rewards_B + dapo_overlong_penalty(lengths_B, max_new_tokens,
                                                        cache_tokens),
  }
  return shaped[mode]()


def _filter_masks(mode: str, zero_var_G: np.ndarray, m) -> tuple[np.ndarray, np.ndarray]:
  """[B] masks of sequences kept in the policy-gradient and the regulariser terms (m:
  rollouts a group, or each group's own [G])."""
  keep = np.repeat(~zero_var_G, m)
  everything = np.ones_like(keep)
  if mode == "off":
    return everything, everything
  if mode == "all":
    return keep, keep
  if mode == "regularizers":
    return everything, keep
  raise ValueError(f"rl.zero_variance_filter={mode!r}: expected one of "
                   f"{update.ZERO_VARIANCE_MODES}")


def training_rewards(rl: rl_settings.RLSettings, scored: rollout.ScoredRollouts, *,
                     max_new_tokens: int) -> np.ndarray:
  """[G, n] rewards the update optimises: verified rewards under `rl.overlong` (unequal
  groups: padded as `scored.rewards_GN` is)."""
  r = scored.rollouts
  return scored.as_groups(shape_rewards(
      rl.overlong, scored.rewards_B, np.asarray(r.mask).sum(-1),
      np.asarray(r.finished), max_new_tokens=max_new_tokens,
      cache_tokens=rl.overlong_cache_tokens))


def selected_rows(rl: rl_settings.RLSettings, rewards_GN: np.ndarray, *,
                  select_rng: jax.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(rows [G * m] into the B = G * n rollouts, advantages [G, m], rewards [G, m])."""
  n = np.shape(rewards_GN)[1]
  m = rl.train_rollouts(n)
  rewards_GN = jnp.asarray(rewards_GN)
  g = rewards_GN.shape[0]
  group_advantages = functools.partial(_group_advantages, rl.advantage, eps=rl.advantage_eps)
  if rl.downsample == "none":
    return np.arange(g * n), np.asarray(group_advantages(rewards_GN)), np.asarray(rewards_GN)
  idx_GM = downsampling.select_rollouts(rl.downsample, rewards_GN, m, rng=select_rng)
  rows = (np.arange(g)[:, None] * n + np.asarray(idx_GM)).reshape(-1)
  rewards_GM = downsampling.gather_groups(rewards_GN, idx_GM)
  if rl.advantages_on == "generated":  # decoupled baseline: statistics from all n
    adv_GM = downsampling.gather_groups(group_advantages(rewards_GN), idx_GM)
  else:
    adv_GM = group_advantages(rewards_GM)
  return rows, np.asarray(adv_GM), np.asarray(rewards_GM)


def unequal_rows(rl: rl_settings.RLSettings, rewards_GN: np.ndarray, sizes_G: np.ndarray,
                 *, select_rng: jax.Array):
  """Unequal groups (per-problem allocation; group g has sizes_G[g] rollouts, `rewards_GN`
  padded past them): (rows into the B = sum(sizes_G) rollouts, advantages [K], rewards
  [K], zero-variance flags [G] of the trained rollouts, kept per group [G]).

  Without down-sampling every rollout trains. PODS keeps min(sizes_G[g], m) of group g
  (m = `rl.train_rollouts(n)`, n the step's mean group size): the down-sampler picks m
  among a group's own rollouts, and a group with at most m trains on all of them, so the
  update never holds more than B_p * m rollouts. Advantages are each group's over its
  trained rollouts, or over all it generated (`rl.advantages_on="generated"`).
  """
  sizes_G = np.asarray(sizes_G)
  valid_GN = rollout.groups_mask(sizes_G, rewards_GN.shape[1])
  advantages = functools.partial(_group_advantages, rl.advantage, eps=rl.advantage_eps)
  adv_GN = np.asarray(advantages(jnp.asarray(rewards_GN), valid_GN=valid_GN))
  if rl.downsample == "none":
    zero_var_G = np.asarray(advantages_lib.zero_variance_groups(rewards_GN, valid_GN))
    return (np.arange(int(sizes_G.sum())), adv_GN[valid_GN], rewards_GN[valid_GN],
            zero_var_G, sizes_G)
  m = rl.train_rollouts(int(sizes_G.sum()) // sizes_G.size)
  kept_G = np.minimum(sizes_G, m)
  idx_GM = np.zeros((sizes_G.size, m), np.int64)   # padded past kept_G[g]
  for g, (size, kept) in enumerate(zip(sizes_G, kept_G)):
    idx_GM[g, :kept] = np.arange(size) if size <= m else np.asarray(
        downsampling.select_rollouts(rl.downsample, rewards_GN[g:g + 1, :size], m,
                                     rng=jax.random.fold_in(select_rng, g)))[0]
  kept_GM = rollout.groups_mask(kept_G, m)
  rewards_GM = np.where(kept_GM, np.take_along_axis(rewards_GN, idx_GM, axis=1), 0.0)
  if rl.advantages_on == "generated":  # decoupled baseline: statistics from all n_g
    adv_GM = np.take_along_axis(adv_GN, idx_GM, axis=1)
  else:
    adv_GM = np.asarray(advantages(jnp.asarray(rewards_GM), valid_GN=kept_GM))
  offsets_G = np.cumsum(sizes_G) - sizes_G
  rows = (offsets_G[:, None] + idx_GM)[kept_GM]
  zero_var_G = np.asarray(advantages_lib.zero_variance_groups(rewards_GM, kept_GM))
  return rows, adv_GM[kept_GM], rewards_GM[kept_GM].astype(np.float32), zero_var_G, kept_G


def _group_advantages(name: str, rewards_GN: jax.Array, *, eps: float, valid_GN=None
                      ) -> jax.Array:
  """A group estimator's advantages [G, N]; zeros for GAE, whose per-token advantages
  the learner computes from the critic's values (`isojax.rl.critic`)."""
  if name == names.GAE:
    return jnp.zeros(jnp.shape(rewards_GN), jnp.float32)
  return advantages_lib.compute_advantages(name, rewards_GN, eps=eps, valid_GN=valid_GN)


def build_train_batch(rl: rl_settings.RLSettings, scored: rollout.ScoredRollouts, *,
                      max_new_tokens: int, select_rng: jax.Array, trained_rows: int = 0
                      ) -> tuple[update.TrainBatch, np.ndarray]:
  """Shaped rewards, advantages, PODS down-sampling and zero-variance masks.

  Returns a host (NumPy) batch whose old/ref log-probs and shuffle key the caller
  fills after sharding it, and the [G] zero-variance flags of the trained groups.
  Unequal groups (per-problem allocation) train on a number of rollouts that varies
  from step to step; `trained_rows` > 0 (B_p * m) pads their batch to that many rows,
  copies of row 0 that no loss term or statistic sees, so the update compiles once.
  """
  n = scored.rewards_GN.shape[1]
  rewards_GN = training_rewards(rl, scored, max_new_tokens=max_new_tokens)
  group_ids_B = None
  if scored.group_sizes is not None:  # unequal groups (per-problem allocation)
    rows, adv_B, rewards_B, zero_var_G, sizes = unequal_rows(
        rl, rewards_GN, scored.group_sizes, select_rng=select_rng)
    group_ids_B = np.repeat(np.arange(sizes.size, dtype=np.int32), sizes)
  else:
    rows, adv_GM, rewards_GM = selected_rows(rl, rewards_GN, select_rng=select_rng)
    adv_B, rewards_B = adv_GM.reshape(-1), np.asarray(rewards_GM).reshape(-1)
    zero_var_G = np.asarray(advantages_lib.zero_variance_groups(jnp.asarray(rewards_GM)))
    sizes = rl.train_rollouts(n)
  # Under dynamic sampling the only zero-variance groups fill a batch the rounds could not
  # complete: they leave every loss term, so the step trains on what there is.
  keep_pg, keep_reg = _filter_masks(
      "all" if rl.dynamic_sampling else rl.zero_variance_filter, zero_var_G, sizes)
  tokens, mask = rollout.sequences(scored, n)
  # The policy's own tokens: forced interruption text is context (in `mask`), not action.
  response_mask = scored.rollouts.actions[rows]
  pad = trained_rows - rows.size if scored.group_sizes is not None and trained_rows else 0
  if pad < 0:
    raise ValueError(f"{rows.size} rollouts to train on, more than the batch's "
                     f"trained_rows={trained_rows}")
  if pad:
    rows = np.concatenate([rows, np.zeros(pad, rows.dtype)])
    response_mask = np.concatenate([response_mask, np.zeros((pad,) + response_mask.shape[1:],
                                                            response_mask.dtype)])
    adv_B, rewards_B = (np.concatenate([x, np.zeros(pad, np.float32)])
                        for x in (adv_B, np.asarray(rewards_B, np.float32)))
    keep_pg, keep_reg = (np.concatenate([k, np.zeros(pad, bool)]) for k in (keep_pg, keep_reg))
    group_ids_B = np.concatenate([group_ids_B, np.zeros(pad, np.int32)])  # no tokens there
  batch = update.TrainBatch(
      tokens=tokens[rows], mask=mask[rows], response_mask=response_mask,
      sampler_logp=scored.rollouts.logprobs[rows],
      old_logp=np.zeros(response_mask.shape, np.float32),
      ref_logp=np.zeros(response_mask.shape, np.float32),
      advantages=adv_B, keep_pg=keep_pg, keep_reg=keep_reg,
      shuffle_rng=None, rewards=np.asarray(rewards_B, np.float32), group_ids=group_ids_B)
  return batch, zero_var_G
