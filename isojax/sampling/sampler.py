"""Jitted batched sampling of n rollouts per problem with a shared prompt cache.

Each of the G prompts is prefilled once; its keys/values stay at [G, P] and every one
of its n rollouts attends to them (`Transformer.decode`), while each rollout keeps its
own [B, T] cache for generated tokens (B = G * n). Decoding runs in a
`lax.while_loop` that stops as soon as every rollout has emitted one of the stop ids
(every end-of-sequence id of the checkpoint, e.g. Llama 3 Instruct's `<|eot_id|>` and
`<|end_of_text|>`, plus any configured extra ids). A rollout that reaches
`max_new_tokens` without one is *truncated* (`Rollouts.finished` is False).

Under a mesh (`jax.set_mesh`), prompts, caches, logits and outputs are split over the
data-parallel axes (logical name `batch`): each device decodes only its own rollouts.
Random draws use JAX's partitionable Threefry, so a sharded call samples exactly what
one device would.

The policy is the tempered distribution softmax(logits / temperature); `logprobs` are
the log-probabilities of the chosen tokens under it (before top-k / top-p truncation,
which only restricts where samples may land), matching what the trainer recomputes.
Temperature 0 means greedy decoding, with log-probs of the untempered distribution.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from isojax.models import sharding
from isojax.models.transformer import DecodeCache, PrefixCache


@flax.struct.dataclass
class Rollouts:
  tokens: jax.Array     # [B, T] int32, pad after EOS
  logprobs: jax.Array   # [B, T] float32 sampler log-probs of `tokens`, 0 where masked
  mask: jax.Array       # [B, T] bool, True on generated tokens (stop token included)
  finished: jax.Array   # [B] bool, emitted a stop token (False: truncated at T)

  @property
  def lengths(self) -> jax.Array:  # [B]
    return self.mask.sum(axis=-1)


@flax.struct.dataclass
class _LoopState:
  step: jax.Array        # [] int32, decode slot of the token being chosen
  logits: jax.Array      # [B, V] logits for the token at `step`
  tokens: jax.Array      # [B, T]
  logprobs: jax.Array    # [B, T]
  done: jax.Array        # [B] bool, a stop token already emitted before `step`
  cache: DecodeCache
  rng: jax.Array


def filter_logits(logits_BV: jax.Array, *, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf."""
  if top_k and top_k < logits_BV.shape[-1]:
    kth = jax.lax.top_k(logits_BV, top_k)[0][..., -1:]
    logits_BV = jnp.where(logits_BV < kth, -jnp.inf, logits_BV)
  if top_p < 1.0:
    sorted_logits = jnp.sort(logits_BV, axis=-1)[..., ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # the smallest logit still inside the nucleus (the top token is always kept)
    keep = mass_before < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits_BV = jnp.where(logits_BV < threshold, -jnp.inf, logits_BV)
  return logits_BV


def _choose(logits_BV, rng, temperature, top_k, top_p):
  """Returns (token [B], log-prob [B]) under the tempered policy."""
  logits_BV = logits_BV.astype(jnp.float32)
  if temperature == 0:
    token = jnp.argmax(logits_BV, axis=-1)
    logp = jax.nn.log_softmax(logits_BV, axis=-1)
  else:
    scaled = logits_BV / temperature
    token = jax.random.categorical(rng, filter_logits(scaled, top_k=top_k, top_p=top_p))
    logp = jax.nn.log_softmax(scaled, axis=-1)
  return token.astype(jnp.int32), jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def _cast_floats(state, dtype: str | None):
  if dtype is None:
    return state
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                      else x, state)


@functools.partial(jax.jit, static_argnames=(
    "graphdef", "n", "max_new_tokens", "temperature", "top_k", "top_p", "stop_ids", "pad_id",
    "weights_dtype"))
def sample(graphdef, state, prompts_GP, prompt_mask_GP, rng, *, n: int,
           max_new_tokens: int, temperature: float, top_k: int = 0, top_p: float = 1.0,
           stop_ids: tuple[int, ...], pad_id: int, weights_dtype: str | None = None
           ) -> Rollouts:
  """Samples n rollouts for each of G left-padded prompts; rollout b belongs to b // n.

  Any id of `stop_ids` ends a rollout (it is kept as the rollout's last token).
  `weights_dtype` ("bfloat16") casts the weights once for the whole call.
  """
  stop_ids_K = jnp.asarray(tuple(stop_ids), jnp.int32)
  model = nnx.merge(graphdef, _cast_floats(state, weights_dtype))
  g = prompts_GP.shape[0]
  b = g * n
  prompts_GP = sharding.constrain(prompts_GP, ("batch", None))
  prompt_mask_GP = sharding.constrain(prompt_mask_GP, ("batch", None))
  first_logits_GV, prefix = model.prefill(prompts_GP, prompt_mask_GP)
  prompt_len_B = jnp.repeat(prompt_mask_GP.sum(-1), n).astype(jnp.int32)

  def body(s: _LoopState) -> _LoopState:
    rng, key = jax.random.split(s.rng)
    token, logp = _choose(s.logits, key, temperature, top_k, top_p)
    token = jnp.where(s.done, pad_id, token)
    logp = jnp.where(s.done, 0.0, logp)
    tokens = s.tokens.at[:, s.step].set(token)
    logprobs = s.logprobs.at[:, s.step].set(logp)
    logits, cache = model.decode(token, prompt_len_B + s.step, s.step, prefix, s.cache)
    return _LoopState(step=s.step + 1, logits=sharding.constrain(logits, ("batch", "vocab")),
                      tokens=tokens, logprobs=logprobs,
                      done=s.done | jnp.isin(token, stop_ids_K), cache=cache, rng=rng)

  def cond(s: _LoopState):
    return (s.step < max_new_tokens) & ~jnp.all(s.done)

  rows = lambda x: sharding.constrain(x, ("batch", None))
  init = _LoopState(
      step=jnp.zeros((), jnp.int32),
      logits=sharding.constrain(jnp.repeat(first_logits_GV, n, axis=0), ("batch", "vocab")),
      tokens=rows(jnp.full((b, max_new_tokens), pad_id, jnp.int32)),
      logprobs=rows(jnp.zeros((b, max_new_tokens), jnp.float32)),
      done=sharding.constrain(jnp.zeros((b,), bool), ("batch",)),
      cache=model.init_decode_cache(b, max_new_tokens),
      rng=rng)
  final = jax.lax.while_loop(cond, body, init)
  # A token is generated iff no stop token came strictly before it.
  is_stop = jnp.isin(final.tokens, stop_ids_K) & (jnp.arange(max_new_tokens) < final.step)
  stops_before = jnp.cumsum(is_stop, axis=-1) - is_stop
  mask = (stops_before == 0) & (jnp.arange(max_new_tokens) < final.step)
  return Rollouts(tokens=jnp.where(mask, final.tokens, pad_id),
                  logprobs=jnp.where(mask, final.logprobs, 0.0), mask=mask,
                  finished=jnp.any(is_stop, axis=-1))


def prefix_cache_for_rollouts(prefix: PrefixCache, n: int) -> PrefixCache:
  """The same cache copied per rollout (what sharing avoids); used by tests."""
  rep = lambda x, axis: jnp.repeat(x, n, axis=axis)
  return PrefixCache(k=rep(prefix.k, 1), v=rep(prefix.v, 1), mask=rep(prefix.mask, 0))
