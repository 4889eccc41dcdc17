"""Decoding with caches: the prompt cache shared by a group's rollouts, each rollout's
own generated cache, and the decode step that attends over both.

The model (`isojax.models.transformer`) runs the same `Block` for every entry point and
lets each pass its own attention; this module holds what only sampling needs:
  `prefill`       forward over left-padded prompts, returning each layer's keys/values
                  once per group (problem), in `PrefixCache` (`prefill_rollouts`: the
                  same for a sampler call, split over the data-parallel axes);
  `init_cache`    the zeroed generated caches, one per rollout, in `DecodeCache`;
  `decode_step`   one new token per rollout attending to the *shared* prompt cache of
                  its group ([G, P] keys, never copied n times) plus its own cache.
Sharing the prompt cache is what makes n rollouts per problem cheap: the prompt is
encoded once per problem and its keys/values are stored once, whatever n is.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from isojax.models import sharding
from isojax.models.transformer import Attention, Block, Transformer
from isojax.sampling.settings import attended_lengths

NEG_INF = -1e30


# Logical axes of one layer's cached keys [G or B, K, H, T] and values [G or B, K, T, H]
# (prompt caches per problem, generated caches per rollout): split over the
# data-parallel axes by problem or rollout and over `tensor` by KV head.
KEY_CACHE_AXES = ("batch", "kv_heads", "head_dim", None)
VALUE_CACHE_AXES = ("batch", "kv_heads", None, "head_dim")


def pin_caches(k, v):
  """Per-layer key and value arrays pinned to their logical axes."""
  return (tuple(sharding.constrain(c, KEY_CACHE_AXES) for c in k),
          tuple(sharding.constrain(c, VALUE_CACHE_AXES) for c in v))


@flax.struct.dataclass
class PrefixCache:
  """Keys/values of the left-padded prompts, one entry per group (problem), one array
  per layer in the layout of `DecodeCache`."""
  k: tuple[jax.Array, ...]  # L x [G, K, H, P]
  v: tuple[jax.Array, ...]  # L x [G, K, P, H]
  mask: jax.Array           # [G, P] bool, False on left padding


@flax.struct.dataclass
class DecodeCache:
  """Keys/values of generated tokens, one entry per rollout (B = G * n), one array per
  layer, each laid out for the decode step's dots (batch dims leading, the contracted
  dim second-minor), so they read it where it lies. Stacked on a leading layer axis
  they would have to be sliced out of the loop carry, and keys stored [T, K, H] would
  be transposed for the score dot: on XLA:CPU either one copies each layer's cache at
  every decode step."""
  k: tuple[jax.Array, ...]  # L x [B, K, H, T]
  v: tuple[jax.Array, ...]  # L x [B, K, T, H]

  def constrain(self) -> DecodeCache:
    """Each layer's arrays pinned to their logical axes (after a gather over rows)."""
    return DecodeCache(*pin_caches(self.k, self.v))


def attend_decode(attn: Attention, q_B1QH, prefix_k_GKHP, prefix_v_GKPH, prefix_mask_GP,
                  k_BKHT, v_BKTH, mask_BT):
  """One query per rollout over its group's prompt cache plus its own cache.

  The n rollouts of a group share its prompt keys, so their queries meet them in one
  dot per group and KV head ([n * R, H] x [H, P]). The softmax runs over both parts
  without concatenating them: one max and one normaliser per query, each part
  exponentiated in its own layout.
  """
  g, kv, h, p = prefix_k_GKHP.shape
  b, n = q_B1QH.shape[0], q_B1QH.shape[0] // g
  scale = attn.cfg.head_dim ** -0.5
  q = q_B1QH[:, 0].reshape(b, kv, -1, h)                             # [B, K, R, H]
  r = q.shape[2]
  # Rows b = (g, j) and heads (k, r) regrouped as [G, K, n * R], and back.
  to_groups = lambda x: jnp.swapaxes(x.reshape(g, n, kv, r, *x.shape[3:]), 1, 2).reshape(
      g, kv, n * r, *x.shape[3:])
  to_rows = lambda x: jnp.swapaxes(x.reshape(g, kv, n, r, *x.shape[3:]), 1, 2).reshape(
      b, kv, r, *x.shape[3:])
  s_prefix = jnp.einsum("gkmh,gkhp->gkmp", to_groups(q), prefix_k_GKHP) * scale
  s_own = jnp.einsum("bkrh,bkht->bkrt", q, k_BKHT) * scale               # [B, K, R, T]
  s_prefix = jnp.where(prefix_mask_GP[:, None, None], s_prefix.astype(jnp.float32), NEG_INF)
  s_own = jnp.where(mask_BT[:, None, None], s_own.astype(jnp.float32), NEG_INF)
  max_BKR = jnp.maximum(to_rows(s_prefix.max(-1)), s_own.max(-1))
  e_prefix = jnp.exp(s_prefix - to_groups(max_BKR)[..., None])          # [G, K, n R, P]
  e_own = jnp.exp(s_own - max_BKR[..., None])                           # [B, K, R, T]
  total_BKR = to_rows(e_prefix.sum(-1)) + e_own.sum(-1)
  dtype = v_BKTH.dtype
  out = to_rows(jnp.einsum("gkmp,gkph->gkmh", e_prefix.astype(dtype), prefix_v_GKPH))
  out = out + jnp.einsum("bkrt,bkth->bkrh", e_own.astype(dtype), v_BKTH)
  out = (out.astype(jnp.float32) / total_BKR[..., None]).astype(dtype)
  return out.reshape(b, 1, *q_B1QH.shape[2:])                        # [B, 1, Q, H]


def prefill(model: Transformer, tokens_GP, mask_GP) -> tuple[jax.Array, PrefixCache]:
  """Encodes left-padded prompts once. Returns (last-token logits [G, V], cache)."""
  positions, mask_GPP = model.causal_inputs(mask_GP)
  rope = model.rope(positions, mask_GP.shape[1])

  def layer(block, x, _):
    return block(x, rope, lambda q, k, v: (block.attn.attend(q, k, v, mask_GPP), (k, v)))
  x, (k_LGPKH, v_LGPKH) = model.scan_layers(layer, model.embed_tokens(tokens_GP))
  k, v = pin_caches([jnp.transpose(c, (0, 2, 3, 1)) for c in k_LGPKH],   # [G, K, H, P]
                     [jnp.transpose(c, (0, 2, 1, 3)) for c in v_LGPKH])   # [G, K, P, H]
  return model.logits(x[:, -1:])[:, 0], PrefixCache(k=k, v=v, mask=mask_GP)


def prefill_rollouts(model: Transformer, prompts_GP, prompt_mask_GP, n: int,
                     group_B: jax.Array | None = None):
  """`prefill` for a call of n rollouts per prompt (or, with `group_B`, rollout b of
  prompt `group_B[b]`), split over the data-parallel axes: (first logits [G, V], the
  shared prompt cache, each rollout's prompt length [B])."""
  prompts_GP = sharding.constrain(prompts_GP, ("batch", None))
  prompt_mask_GP = sharding.constrain(prompt_mask_GP, ("batch", None))
  first_logits_GV, prefix = prefill(model, prompts_GP, prompt_mask_GP)
  prompt_len_G = prompt_mask_GP.sum(-1).astype(jnp.int32)
  if group_B is None:
    return first_logits_GV, prefix, jnp.repeat(prompt_len_G, n)
  return first_logits_GV, prefix, sharding.constrain(prompt_len_G[group_B], ("batch",))


def local_groups(group_B: jax.Array, num_groups: int, shards: int) -> jax.Array:
  """[X, B / X]: each rollout's group among its data-parallel shard's own G / X groups
  (the index `gather_groups` takes); `check_groups` holds that they are its own."""
  per_shard = num_groups // shards
  return (group_B.reshape(shards, -1)
          - (jnp.arange(shards, dtype=group_B.dtype) * per_shard)[:, None])


def init_cache(model: Transformer, batch: int, length: int) -> DecodeCache:
  """Zeroed generated caches for `batch` rollouts of up to `length` tokens."""
  cfg = model.cfg
  k, h = cfg.num_kv_heads, cfg.head_dim
  zeros = lambda shape: jnp.zeros(shape, jnp.dtype(cfg.dtype))
  return DecodeCache(*pin_caches([zeros((batch, k, h, length))] * cfg.num_layers,
                                  [zeros((batch, k, length, h))] * cfg.num_layers))

def layer_blocks(model: Transformer) -> tuple[Block, ...]:
  """One `Block` per layer, its weights sliced from the stacked ones. Taken once per
  sampling call, outside the decode loop: sliced inside it, every step would copy
  every layer's weights out of the stack."""
  graphdef, stacked = nnx.split(model.layers)
  return tuple(nnx.merge(graphdef, jax.tree.map(lambda x, i=i: x[i], stacked))
               for i in range(model.cfg.num_layers))

def decode_step(model: Transformer, token_B, position_B, step, prefix: PrefixCache,
                cache: DecodeCache, *, blocks: tuple[Block, ...] | None = None,
                groups_XW: jax.Array | None = None, cache_block: int = 0):
  """Feeds one token per rollout at decode slot `step`. Returns (logits [B, V], cache).

  `step` is one slot for every row ([], the static sampler) or one per row ([B],
  continuous batching, where each row is at its own point of its own rollout). Rows
  attend to the prompt cache of group b // n, or, with `groups_XW` [X, W] (B = X * W
  slots), to the group `groups_XW[x, w]` among the x-th of X equal blocks of groups (row
  x * W + w; the blocks are the data-parallel shards, so the gather stays on each device).
  The layers run as a Python loop over `blocks` (`layer_blocks(model)`, which a
  caller decoding many steps takes once), each writing its slot of its own cache in place, so
  decoding never holds two copies of it and no step copies a layer's cache or weights.
  Compile time grows with depth, as in any unrolled decoder.

  `cache_block` > 0 attends over the generated cache in blocks of that many slots: a step
  reads only the blocks up to the one holding the furthest row's slot (`lax.switch`
  among `attended_lengths`, one static length per branch), not all T preallocated
  slots, which at long outputs is most of a decode step's memory traffic. The slots
  left out are masked anyway, so the result is the same.
  """
  blocks = layer_blocks(model) if blocks is None else blocks
  b, t = token_B.shape[0], cache.v[0].shape[2]
  step = jnp.asarray(step, jnp.int32)
  own_mask_BT = jnp.broadcast_to(jnp.arange(t) <= step[..., None], (b, t))
  lengths = attended_lengths(t, cache_block)
  # One scalar for all rows (under a mesh, a max over the data-parallel shards).
  branch = jnp.minimum(jnp.max(step) // max(cache_block, 1), len(lengths) - 1)
  prefix_mask = prefix.mask if groups_XW is None else gather_groups(prefix.mask, groups_XW)
  rope = model.rope(position_B[:, None], prefix.mask.shape[1] + t)  # positions < P + T
  x = model.embed_tokens(token_B[:, None])
  k_cache, v_cache = [], []
  layers = zip(blocks, cache.k, cache.v, prefix.k, prefix.v)
  for block, k_layer, v_layer, prefix_k, prefix_v in layers:
    if groups_XW is not None:
      prefix_k, prefix_v = (gather_groups(c, groups_XW) for c in (prefix_k, prefix_v))

    def attention(q, k, v, block=block, k_layer=k_layer, v_layer=v_layer, prefix_k=prefix_k,
                  prefix_v=prefix_v):
      k_all = write_slot(k_layer, k[:, 0], step, axis=3)   # [B, K, H, T]
      v_all = write_slot(v_layer, v[:, 0], step, axis=2)   # [B, K, T, H]

      def attend_first(length):  # the layer's first `length` slots, sliced in the branch
        return lambda: attend_decode(
            block.attn, q, prefix_k, prefix_v, prefix_mask, k_all[..., :length], v_all[:, :, :length],
            own_mask_BT[:, :length])
      branches = [attend_first(length) for length in lengths]
      out = branches[0]() if len(branches) == 1 else jax.lax.switch(branch, branches)
      return out, (k_all, v_all)
    x, (k_layer, v_layer) = block(x, rope, attention)
    k_cache.append(k_layer)
    v_cache.append(v_layer)
  return model.logits(x)[:, 0], DecodeCache(k=tuple(k_cache), v=tuple(v_cache))


def write_slot(cache, new_BKH, step, axis: int):
  """One layer's cache [B, K, ...] with `new_BKH` written at slot `step` of `axis`.

  `step` is one slot for all rows ([]: a dynamic-update-slice) or one per row ([B]):
  then one scatter over rows, which XLA:CPU does in place. Where the rows are split over
  devices, the same update batched over rows (vmap) keeps each device's scatter local;
  the plain scatter would all-gather every row's new keys (and on CPU the batched form
  is not in place, so it copies the cache and slows decode).
  """
  new = jnp.expand_dims(new_BKH.astype(cache.dtype), axis)
  if step.ndim == 0:
    return jax.lax.dynamic_update_slice(cache, new, (0,) * axis + (step,) + (0,) * (3 - axis))
  if sharding.batch_shards(jax.sharding.get_abstract_mesh()) == 1:
    index = (jnp.arange(new.shape[0]),) + (slice(None),) * (axis - 1) + (step,)
    return cache.at[index].set(new_BKH.astype(cache.dtype))
  row_update = lambda c, x, t: jax.lax.dynamic_update_slice(
      c, x, (0,) * (axis - 1) + (t,) + (0,) * (3 - axis))
  return jax.vmap(row_update)(cache, new, step)


def gather_groups(x_G: jax.Array, groups_XW: jax.Array) -> jax.Array:
  """Rows `groups_XW[x, w]` of the x-th of X equal blocks of `x_G` [G, ...] -> [X * W, ...].

  Batched over the blocks (the data-parallel shards of the group axis), so under a mesh
  each device gathers from its own groups only.
  """
  shards, slots = groups_XW.shape
  blocks = x_G.reshape(shards, x_G.shape[0] // shards, *x_G.shape[1:])
  rows = jax.vmap(lambda block, idx: block[idx])(blocks, groups_XW)
  return sharding.constrain(rows.reshape(shards * slots, *x_G.shape[1:]),
                            ("batch",) + (None,) * (x_G.ndim - 1))
