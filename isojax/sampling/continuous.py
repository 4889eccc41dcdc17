"""Continuous batching: a call's rollouts decoded in a few rows that are refilled.

Lockstep decoding runs B rows until the longest rollout stops, so an uneven batch
spends most of its steps on rows that are already done. Here `spec.num_slots` rows
("slots") decode whichever rollouts are still running, and a slot whose rollout ends
takes the next queued one, which reads its prompt from the shared prompt cache; the
iterations then follow the total number of tokens. Each data-parallel shard runs its
own slots and queue over its own groups, so every gather and write stays on its device.
With `spec.min_slots` the slots halve as the queue drains (`slot_levels`, `_compact`).
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp

from isojax.models import sharding
from isojax.sampling import decode, distributions, spec as spec_lib
from isojax.sampling.decode import DecodeCache
from isojax.sampling.spec import Rollouts, SampleSpec


@flax.struct.dataclass
class _Slots:
  """Continuous batching state, per data-parallel shard x of X: W slots, U rollouts."""
  rollout: jax.Array    # [X, W] int32 rollout (shard-local id) in the slot; U: empty
  position: jax.Array   # [X, W] int32 index of `token` among the rollout's tokens
  token: jax.Array      # [X, W] int32 the token the slot feeds this iteration
  taken: jax.Array      # [X] int32 how many queue entries have been handed a slot
  tokens: jax.Array     # [X, U, T] int32
  logprobs: jax.Array   # [X, U, T] float32
  lengths: jax.Array    # [X, U] int32 tokens written per rollout
  cache: DecodeCache    # L x [X * W, K, H, T] keys, L x [X * W, K, T, H] values
  rng: jax.Array
  thinking: jax.Array     # [X, U] bool, no end-of-thinking marker yet
  interrupted: jax.Array  # [X, U] bool, the interruption text was forced in


def _refill(rollout_W, position_W, token_W, finished_W, queue_U, queued, taken, first_U):
  """One shard: finished slots take the next queued rollouts (empty when none is left)."""
  u = queue_U.shape[0]
  rank_W = jnp.cumsum(finished_W) - 1
  index_W = taken + rank_W
  new_W = jnp.where(index_W < queued, queue_U[jnp.minimum(index_W, u - 1)], u)
  rollout_W = jnp.where(finished_W, new_W, rollout_W)
  position_W = jnp.where(finished_W | (rollout_W == u), 0, position_W + 1)
  token_W = jnp.where(finished_W, first_U[jnp.minimum(new_W, u - 1)], token_W)
  return rollout_W, position_W, token_W, taken + finished_W.sum()


def slot_levels(slots: int, min_slots: int) -> tuple[int, ...]:
  """The slot counts (per data-parallel shard) continuous batching decodes with, in order:
  `slots`, then halved while at least `min_slots` (0: `slots` only). E.g. (64, 32, 16, 8)."""
  levels = [slots]
  while min_slots and levels[-1] // 2 >= max(min_slots, 1):
    levels.append(levels[-1] // 2)
  return tuple(levels)


def _compact(st: _Slots, slots: int, empty: int) -> _Slots:
  """Each shard's busy slots (at most `slots` of them) moved into its first `slots` rows,
  their caches with them; the rows left are empty (rollout `empty`)."""
  shards, w = st.rollout.shape
  # Busy slots first, in their order; a stable sort keeps the empty ones after them.
  keep_XW = jnp.argsort(st.rollout == empty, axis=-1, stable=True)[:, :slots]
  pick = jax.vmap(lambda x, i: x[i])
  # Each layer's cache [X * W, ...] is gathered on each shard's own rows.
  rows = lambda c: pick(c.reshape(shards, w, *c.shape[1:]), keep_XW).reshape(
      shards * slots, *c.shape[1:])
  cache = jax.tree.map(rows, st.cache).constrain()
  return st.replace(rollout=pick(st.rollout, keep_XW), position=pick(st.position, keep_XW),
                    token=pick(st.token, keep_XW), cache=cache)


def _first_draws(first_logits_GV, key, spec: SampleSpec, choose, shard, group_B=None):
  """Every rollout's first token, drawn from its prompt's prefill logits: ([X, U] first
  tokens, the [X, U, T] tokens and log-probs with their first column set)."""
  n, t = spec.n, spec.max_new_tokens
  g = first_logits_GV.shape[0]
  # n draws from each prompt's logits (not one draw from logits repeated n times: XLA:CPU
  # fuses that repeat into the argmax reduction, which LLVM is very slow to compile).
  first_NG, first_logp_NG = jax.vmap(choose, in_axes=(None, 0))(
      first_logits_GV, jax.random.split(key, n))
  if group_B is None:
    b = g * n
    first_B, first_logp_B = first_NG.T.reshape(b), first_logp_NG.T.reshape(b)
  else:  # rollout b takes draw `rank` of its prompt, its place among the prompt's rollouts
    b = group_B.shape[0]
    rank_B = jnp.arange(b) - jnp.searchsorted(group_B, jnp.arange(g))[group_B]
    first_B, first_logp_B = first_NG[rank_B, group_B], first_logp_NG[rank_B, group_B]
  tokens = shard(jnp.full((b, t), spec.pad_id, jnp.int32).at[:, 0].set(first_B))
  logprobs = shard(jnp.zeros((b, t), jnp.float32).at[:, 0].set(first_logp_B))
  return shard(first_B), tokens, logprobs


def _queue(first_XU, stops, t: int, w: int):
  """Each shard's queue of the rollouts that still decode (their first token no stop):
  ([X, U] rollout ids, queued first; [X] how many; [X, W] the first W in the slots,
  u marking an empty slot)."""
  u = first_XU.shape[1]
  needs_decode_XU = ~jnp.isin(first_XU, stops) & (t > 1)
  queue = jnp.argsort(~needs_decode_XU, axis=-1, stable=True).astype(jnp.int32)
  queued = needs_decode_XU.sum(-1).astype(jnp.int32)
  start = jnp.arange(w)
  rollout = jnp.where(start < queued[:, None], queue[:, jnp.minimum(start, u - 1)], u)
  return queue, queued, rollout


def _slot_groups(group_B, g: int, n: int, u: int, shards: int):
  """The function from the [X, W] rollout ids in the slots (u: empty) to each slot's
  prompt among its shard's own: rollout // n, or its `group_B` entry."""
  if group_B is None:
    return lambda rollout_XW: jnp.minimum(rollout_XW, u - 1) // n
  group_XU = decode.local_groups(group_B, g, shards)
  return lambda rollout_XW: jax.vmap(lambda x, i: x[jnp.minimum(i, u - 1)])(group_XU,
                                                                            rollout_XW)


def _running_until(fewer: int, u: int, queued_X):
  """The decode loop's condition: a slot is busy (rollout id below `u`), and (fewer > 0)
  the shards cannot yet move to `fewer` slots (a queue not empty, or more busy)."""
  def cond(st: _Slots):
    busy_X = jnp.sum(st.rollout < u, axis=-1)
    if not fewer:
      return jnp.any(busy_X > 0)
    return jnp.any(busy_X > 0) & ~jnp.all((st.taken >= queued_X) & (busy_X <= fewer))
  return cond


def sample(model, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec, group_B=None
           ) -> Rollouts:
  """n rollouts per prompt decoded in `spec.num_slots` rows, refilled as rollouts finish
  (with `group_B` [B], `spec_lib.group_index`'s: rollout b of prompt `group_B[b]`).

  Each prompt is prefilled once; the first token of every rollout is drawn from its
  prompt's prefill logits up front, and the rollouts that do not stop there are queued.
  Each data-parallel shard (X of them, the `batch` split of the mesh) owns its G / X
  groups and W = num_slots / X slots and runs its own queue. An iteration feeds every
  busy slot's token, draws the next, and hands the slots whose rollout just ended (stop
  id, or `max_new_tokens` reached) to the next queued rollouts of the shard, whose prompt
  keys/values are read from the shared prompt cache (no prefill is repeated). The loop
  ends when every slot is empty, so the iterations track the total number of tokens, not
  B times the longest rollout.

  With `min_slots`, the loop at W slots per shard also ends once every shard's queue is
  empty and at most W / 2 of its slots are busy; those move, with their caches, into
  W / 2 slots (`_compact`) and a loop at W / 2 goes on, down to `slot_levels`' last
  count. Where a decode step costs in proportion to its rows (CPU), the long rollouts
  of an uneven batch then no longer carry W - 1 mostly empty rows; each level is one
  more compiled loop body.
  Each rollout sees the same conditionals as in lockstep decoding; only the random
  keys differ, so greedy decoding is identical and sampling equal in distribution.
  """
  n, num_slots, min_slots = spec.n, spec.num_slots, spec.min_slots
  interruption = spec.interruption
  first_logits_GV, prefix, prompt_len_B = decode.prefill_rollouts(
      model, prompts_GP, prompt_mask_GP, n, group_B)
  blocks = decode.layer_blocks(model)
  choose = functools.partial(distributions.choose, spec=spec)
  stops = spec_lib.stop_ids(spec)
  g = first_logits_GV.shape[0]
  b, t = (g * n if group_B is None else group_B.shape[0]), spec.max_new_tokens
  shards = sharding.batch_shards(jax.sharding.get_abstract_mesh())
  if g % shards or num_slots % shards:
    raise ValueError(f"continuous batching on {shards} data-parallel shards needs groups ({g}) "
                     f"and sampling.decode_slots ({num_slots}) divisible by {shards}")
  u, w = b // shards, num_slots // shards
  shard = lambda x: sharding.constrain(x.reshape(shards, -1, *x.shape[1:]),
                                       ("batch",) + (None,) * x.ndim)
  rng, first_key = jax.random.split(rng)
  first_XU, tokens, logprobs = _first_draws(first_logits_GV, first_key, spec, choose, shard,
                                            group_B)
  queue, queued, rollout = _queue(first_XU, stops, t, w)
  prompt_len_XU = shard(prompt_len_B)
  by_shard = jax.vmap(lambda x, i: x[jnp.minimum(i, u - 1)])
  slot_groups = _slot_groups(group_B, g, n, u, shards)

  def body(st: _Slots) -> _Slots:
    rng, key = jax.random.split(st.rng)
    slots = st.rollout.shape[1]
    flat = lambda x: x.reshape(-1)
    logits, cache = decode.decode_step(
        model, flat(st.token), flat(by_shard(prompt_len_XU, st.rollout) + st.position),
        flat(st.position), prefix, st.cache, blocks=blocks,
        groups_XW=slot_groups(st.rollout), cache_block=spec.decode_block)
    token, logp = choose(sharding.constrain(logits, ("batch", "vocab")), key)
    token, logp = token.reshape(shards, slots), logp.reshape(shards, slots)
    # Empty slots (rollout u) decode a dummy row and write nowhere.
    put = jax.vmap(lambda a, i, j, v: a.at[i, j].set(v, mode="drop"))
    set_rows = jax.vmap(lambda a, i, v: a.at[i].set(v, mode="drop"))
    busy, chosen_at = st.rollout < u, st.position + 1   # [X, W]
    thinking, interrupted = st.thinking, st.interrupted
    if interruption:
      slot_interrupted = by_shard(interrupted, st.rollout) | (
          (chosen_at == interruption.think_budget) & by_shard(thinking, st.rollout) & busy)
      token, logp = interruption.force(chosen_at, slot_interrupted, token, logp)
      interrupted = set_rows(interrupted, st.rollout, slot_interrupted)
    finished = busy & (jnp.isin(token, stops) | (chosen_at + 1 >= t))
    if interruption:
      finished = finished | (busy & slot_interrupted & (chosen_at + 1 >= interruption.end))
    tokens = put(st.tokens, st.rollout, chosen_at, token)
    if interruption:
      ended = interruption.ends_thinking(by_shard(tokens, st.rollout), chosen_at)
      thinking = set_rows(thinking, st.rollout, by_shard(thinking, st.rollout) & ~ended)
    lengths = set_rows(st.lengths, jnp.where(finished, st.rollout, u), chosen_at + 1)
    rollout, position, token_next, taken = jax.vmap(_refill)(
        st.rollout, st.position, token, finished, queue, queued, st.taken, first_XU)
    return _Slots(rollout=rollout, position=position, token=token_next, taken=taken,
                  tokens=tokens, logprobs=put(st.logprobs, st.rollout, chosen_at, logp),
                  lengths=lengths, cache=cache, rng=rng, thinking=thinking,
                  interrupted=interrupted)

  thinking = jnp.ones((shards, u), bool)
  if interruption:  # a one-token marker may be the first token
    thinking = ~interruption.ends_thinking(tokens, 0)
  st = _Slots(rollout=rollout, position=jnp.zeros((shards, w), jnp.int32),
              token=by_shard(first_XU, rollout), taken=jnp.minimum(queued, w),
              tokens=tokens, logprobs=logprobs, lengths=jnp.ones((shards, u), jnp.int32),
              cache=decode.init_cache(model, num_slots, t), rng=rng, thinking=thinking,
              interrupted=jnp.zeros((shards, u), bool))
  levels = slot_levels(w, -(-min_slots // shards))
  for fewer in levels[1:]:
    st = _compact(jax.lax.while_loop(_running_until(fewer, u, queued), body, st), fewer, u)
  final = jax.lax.while_loop(_running_until(0, u, queued), body, st)
  unshard = lambda x: x.reshape(b, *x.shape[2:])
  return spec_lib.rollouts_from(unshard(final.tokens), unshard(final.logprobs),
                                unshard(final.lengths), unshard(final.interrupted), stops, spec)
