"""Lockstep decoding: all B = G * n rollouts of a call advance one token per step together.

The plainest schedule, and the one that can be cut into segments: `start` prefills,
`advance` decodes up to a given length (with the model its caller passes; the cache
keeps what earlier weights wrote), `finish` masks. `sampler.sample` runs the three in
one program; in-flight weight updates (`rl.rollout`) run them apart, so a policy can
change between segments. Every step decodes all B rows until the last rollout stops;
continuous batching (`continuous`) is the schedule whose steps track the tokens left.
"""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from isojax.models import sharding
from isojax.sampling import decode, distributions, spec as spec_lib
from isojax.sampling.decode import DecodeCache, PrefixCache
from isojax.sampling.spec import Rollouts, SampleSpec


@flax.struct.dataclass
class _LoopState:
  step: jax.Array        # [] int32, decode slot of the token being chosen
  logits: jax.Array      # [B, V] logits for the token at `step`
  tokens: jax.Array      # [B, T]
  logprobs: jax.Array    # [B, T]
  done: jax.Array        # [B] bool, a stop token already emitted before `step`
  cache: DecodeCache
  rng: jax.Array
  thinking: jax.Array    # [B] bool, no end-of-thinking marker yet (forced interruptions)
  interrupted: jax.Array  # [B] bool, the interruption text was forced in


@flax.struct.dataclass
class Decoding:
  """A lockstep sampler call in progress: `start`, then `advance` (any number of times,
  each with the weights of its choice), then `finish`."""
  loop: _LoopState
  prefix: PrefixCache
  prompt_len_B: jax.Array  # [B] int32
  groups_XU: jax.Array | None = None  # [X, B / X] each row's prompt among its shard's
                                      # own (unequal groups); None: row b's is b // n

  @property
  def step(self) -> jax.Array:  # [] int32: tokens generated per row so far
    return self.loop.step

  @property
  def done(self) -> jax.Array:  # [B] bool
    return self.loop.done


def start(model, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec, group_B=None
          ) -> Decoding:
  """Prefills the prompts; no token is chosen yet. Rollout b is of prompt b // n, or
  with `group_B` [B] (`spec.group_index`'s) of prompt `group_B[b]`."""
  n, t = spec.n, spec.max_new_tokens
  g = prompts_GP.shape[0]
  first_logits_GV, prefix, prompt_len_B = decode.prefill_rollouts(
      model, prompts_GP, prompt_mask_GP, n, group_B)
  if group_B is None:
    b, groups_XU, first_logits_BV = g * n, None, jnp.repeat(first_logits_GV, n, axis=0)
  else:
    shards = sharding.batch_shards(jax.sharding.get_abstract_mesh())
    b, groups_XU = group_B.shape[0], decode.local_groups(group_B, g, shards)
    first_logits_BV = first_logits_GV[group_B]
  rows = lambda x: sharding.constrain(x, ("batch", None))
  loop = _LoopState(
      step=jnp.zeros((), jnp.int32),
      logits=sharding.constrain(first_logits_BV, ("batch", "vocab")),
      tokens=rows(jnp.full((b, t), spec.pad_id, jnp.int32)),
      logprobs=rows(jnp.zeros((b, t), jnp.float32)),
      done=sharding.constrain(jnp.zeros((b,), bool), ("batch",)),
      cache=decode.init_cache(model, b, t),
      rng=rng, thinking=jnp.ones((b,), bool), interrupted=jnp.zeros((b,), bool))
  return Decoding(loop, prefix, prompt_len_B, groups_XU)


def advance(model, d: Decoding, spec: SampleSpec, until=None) -> Decoding:
  """The decode loop from `d`, to the end (`until` None) or `until` tokens."""
  cut, pad_id, stops = spec.interruption, spec.pad_id, spec_lib.stop_ids(spec)
  blocks = decode.layer_blocks(model)  # once, outside the decode loop
  prefix, prompt_len_B = d.prefix, d.prompt_len_B

  def body(s: _LoopState) -> _LoopState:
    rng, key = jax.random.split(s.rng)
    token, logp = distributions.choose(s.logits, key, spec)
    interrupted, thinking = s.interrupted, s.thinking
    if cut:
      interrupted = interrupted | ((s.step == cut.think_budget) & thinking & ~s.done)
      token, logp = cut.force(s.step, interrupted, token, logp)
    token = jnp.where(s.done, pad_id, token)
    logp = jnp.where(s.done, 0.0, logp)
    tokens = s.tokens.at[:, s.step].set(token)
    logprobs = s.logprobs.at[:, s.step].set(logp)
    done = s.done | jnp.isin(token, stops)
    if cut:
      thinking = thinking & ~cut.ends_thinking(tokens, s.step)
      done = done | (interrupted & (s.step + 1 >= cut.end))
    logits, cache = decode.decode_step(model, token, prompt_len_B + s.step, s.step, prefix,
                                       s.cache, blocks=blocks, groups_XW=d.groups_XU,
                                       cache_block=spec.decode_block)
    return _LoopState(step=s.step + 1, logits=sharding.constrain(logits, ("batch", "vocab")),
                      tokens=tokens, logprobs=logprobs, done=done, cache=cache, rng=rng,
                      thinking=thinking, interrupted=interrupted)

  def cond(s: _LoopState):
    running = (s.step < spec.max_new_tokens) & ~jnp.all(s.done)
    return running if until is None else running & (s.step < until)

  return d.replace(loop=jax.lax.while_loop(cond, body, d.loop))


def finish(d: Decoding, spec: SampleSpec) -> Rollouts:
  """The rollouts decoded so far, masked after each row's stop token."""
  final, cut = d.loop, spec.interruption
  written = final.step
  if cut:  # an interrupted row ends at its answer budget, whatever the others do
    written = jnp.where(final.interrupted, jnp.minimum(written, cut.end), written)
  return spec_lib.rollouts_from(final.tokens, final.logprobs, written, final.interrupted,
                                spec_lib.stop_ids(spec), spec)
