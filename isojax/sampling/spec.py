"""What a sampler call is asked for and what it gives back.

`SampleSpec` is the one narrow object every part of the sampler takes (the draws,
lockstep decoding, continuous batching and forced interruptions read their fields from
it), static under `jax.jit`, so each spec compiles once. `Rollouts` is what every
decoding schedule returns, and `rollouts_from` the masks they all end with, so the two
schedules cannot disagree on what a rollout is.
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from isojax.sampling.interruption import Interruption


@dataclasses.dataclass(frozen=True)
class SampleSpec:
  """What one sampler call draws: static under `jax.jit` (each spec compiles once).

  `rl.rollout.sample_spec` builds it from `config.sampling` (`SamplingSettings`), the
  tokenizer's stop and pad ids, and the call's continuous-batching slots.
  """
  n: int                                 # rollouts per prompt (with unequal groups,
                                         # `group_index`: the most of any prompt)
  max_new_tokens: int
  temperature: float
  stop_ids: tuple[int, ...]
  pad_id: int
  top_k: int = 0
  top_p: float = 1.0
  weights_dtype: str | None = None       # "bfloat16": weights cast once per call (None:
                                         # bfloat16 under bfloat16 activations)
  dtype: str | None = None               # "bfloat16": activations and caches
  num_slots: int = 0                     # > 0: continuous batching in this many rows
  min_slots: int = 0                     # > 0: halve the slots down to this many
  decode_block: int = 0                  # > 0: attend over filled cache blocks only
  interruption: Interruption | None = None  # forced interruptions; None: off
  merge_adapters: bool = True            # LoRA: decode with W + A @ B * alpha / r


@flax.struct.dataclass
class Rollouts:
  tokens: jax.Array     # [B, T] int32, pad after EOS
  logprobs: jax.Array   # [B, T] float32 sampler log-probs of `tokens`, 0 where masked
  mask: jax.Array       # [B, T] bool, True on generated tokens (stop token included)
  finished: jax.Array   # [B] bool, emitted a stop token (False: truncated at T)
  forced: jax.Array     # [B, T] bool, the interruption text written by the sampler
                        # (context, not actions: log-prob 0, outside the loss)

  @property
  def lengths(self) -> jax.Array:  # [B]
    return self.mask.sum(axis=-1)

  @property
  def actions(self) -> jax.Array:  # [B, T] bool: tokens the policy chose
    return self.mask & ~self.forced

  @property
  def interrupted(self) -> jax.Array:  # [B] bool: reached the thinking budget
    return self.forced.any(axis=-1)


def stop_ids(spec: SampleSpec) -> jax.Array:
  """The spec's stop ids as one int32 array (any of them ends a rollout)."""
  return jnp.asarray(tuple(spec.stop_ids), jnp.int32)


def rollouts_from(tokens_BT, logprobs_BT, written, interrupted_B, stops, spec: SampleSpec
                  ) -> Rollouts:
  """Masks each row after its first stop token (of `stops`, the array `stop_ids(spec)`
  the decoding compared against) and from position `written` ([] or [B]) on; marks the
  interruption text of the `interrupted_B` rows as forced."""
  b, t = tokens_BT.shape
  cut = spec.interruption
  was_written = jnp.arange(t) < jnp.asarray(written)[..., None]
  # A token is generated iff no stop token came strictly before it.
  is_stop = jnp.isin(tokens_BT, stops) & was_written
  stops_before = jnp.cumsum(is_stop, axis=-1) - is_stop
  mask = (stops_before == 0) & was_written
  forced = cut.forced_mask(interrupted_B, t) & mask if cut else jnp.zeros((b, t), bool)
  return Rollouts(tokens=jnp.where(mask, tokens_BT, spec.pad_id),
                  logprobs=jnp.where(mask, logprobs_BT, 0.0), mask=mask,
                  finished=jnp.any(is_stop, axis=-1), forced=forced)


def group_index(sizes_G, n_max: int, shards: int = 1) -> np.ndarray:
  """[B] int32, the prompt of each rollout for a call of `sizes_G[g]` rollouts of prompt
  g (B = their sum), rollouts of a prompt side by side, in prompt order: the `group_B`
  a sampler call with unequal groups takes.

  A data-parallel shard decodes the x-th B / X rollouts against its own G / X prompts,
  so each shard's prompts must hold the same number of rollouts; ValueError, naming
  the sizes, where they do not, or where a size is outside 1..n_max (spec.n)."""
  sizes_G = np.asarray(sizes_G, np.int64)
  if sizes_G.ndim != 1 or not sizes_G.size:
    raise ValueError(f"group sizes {sizes_G.tolist()}: expected one size per prompt")
  if sizes_G.min() < 1 or sizes_G.max() > n_max:
    raise ValueError(f"group sizes {sizes_G.tolist()}: expected each in 1..{n_max} "
                     "(the sampler's n, the largest group)")
  if sizes_G.size % shards:
    raise ValueError(f"{sizes_G.size} prompts cannot be split over {shards} "
                     "data-parallel shards")
  per_shard = sizes_G.reshape(shards, -1).sum(axis=1)
  if np.any(per_shard != per_shard[0]):
    raise ValueError(f"group sizes {sizes_G.tolist()}: each of the {shards} data-parallel "
                     f"shards' prompts must hold the same number of rollouts (they hold "
                     f"{per_shard.tolist()})")
  return np.repeat(np.arange(sizes_G.size, dtype=np.int32), sizes_G)
