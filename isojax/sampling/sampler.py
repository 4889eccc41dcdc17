"""Jitted batched sampling of n rollouts per problem with a shared prompt cache.

Each of the G prompts is prefilled once; its keys/values stay at [G, P] and every one
of its n rollouts attends to them (`decode.decode_step`), while each rollout keeps its
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

import dataclasses
import functools
import math

import flax
import jax
import jax.numpy as jnp
from flax import nnx

from isojax.models import lora, sharding
from isojax.sampling import decode
from isojax.sampling.decode import DecodeCache, PrefixCache


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


@dataclasses.dataclass(frozen=True)
class Interruption:
  """ScaleRL's forced interruption: a rollout still thinking after `think_budget` tokens
  gets `text_ids` written in by the sampler, then at most `answer_budget` more tokens.
  "Still thinking": `think_end_ids` (e.g. the ids of "</think>") not yet generated."""
  think_budget: int
  text_ids: tuple[int, ...]
  answer_budget: int
  think_end_ids: tuple[int, ...]

  @property
  def end(self) -> int:
    """The length at which an interrupted rollout stops."""
    return self.think_budget + len(self.text_ids) + self.answer_budget

  def force(self, position, interrupted, token, logp):
    """(token, logp) with the interruption text written where `position` (the index of
    the token being chosen) falls in its window on an `interrupted` row; log-prob 0."""
    offset = position - self.think_budget
    window = interrupted & (offset >= 0) & (offset < len(self.text_ids))
    text = jnp.asarray(self.text_ids, jnp.int32)[jnp.clip(offset, 0, len(self.text_ids) - 1)]
    return jnp.where(window, text, token), jnp.where(window, 0.0, logp)

  def ends_thinking(self, tokens, position):
    """Whether the `think_end_ids` end at `position` (an index into the last axis of
    `tokens` [..., T], broadcast against `tokens`' leading axes)."""
    size = len(self.think_end_ids)
    position = jnp.broadcast_to(position, tokens.shape[:-1])
    at = position[..., None] - (size - 1) + jnp.arange(size)
    found = jnp.take_along_axis(tokens, jnp.clip(at, 0, tokens.shape[-1] - 1), axis=-1)
    return jnp.all((found == jnp.asarray(self.think_end_ids, jnp.int32)) & (at >= 0), axis=-1)

  def forced_mask(self, interrupted_B, t: int):
    """[B, T]: where the interruption text lies on each interrupted row."""
    positions = jnp.arange(t)
    return interrupted_B[:, None] & (positions >= self.think_budget) & (
        positions < self.think_budget + len(self.text_ids))


def filter_logits(logits_BV: jax.Array, *, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf.

  Nothing is sorted: top-k uses `lax.top_k` (a partial selection), and with top-k on,
  the nucleus is found among those k candidates; top-p alone finds its cut by bisection
  (`nucleus_threshold`). With both off it returns `logits_BV` itself.
  """
  v = logits_BV.shape[-1]
  top_k = top_k if 0 < top_k < v else 0
  if top_k:
    candidates = jax.lax.top_k(logits_BV, top_k)[0]       # [B, k], descending
    logits_BV = jnp.where(logits_BV < candidates[..., -1:], -jnp.inf, logits_BV)
  if top_p >= 1.0:
    return logits_BV
  if top_k:
    # Descending candidates; the mass outside them is zero after the cut above.
    probs = jax.nn.softmax(candidates, axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # The smallest logit still inside the nucleus (the top token is always kept).
    threshold = jnp.min(jnp.where(mass_before < top_p, candidates, jnp.inf), axis=-1,
                        keepdims=True)
  else:
    threshold = nucleus_threshold(logits_BV, top_p)
  return jnp.where(logits_BV < threshold, -jnp.inf, logits_BV)


def nucleus_threshold(logits_BV: jax.Array, top_p: float) -> jax.Array:
  """[B, 1]: the smallest logit v of each row whose strictly larger logits hold less than
  `top_p` of the probability; the nucleus is every logit >= v (the top one always).

  The same cut as ranking the row and keeping tokens while the mass before them is below
  `top_p`, found without a sort: the mass above x falls as x rises and drops only at
  logit values, so v is the smallest float32 x where it is below `top_p`. That x is
  bisected exactly over the order-preserving uint32 codes of float32 (32 halvings of the
  row's [min, max] range, each one masked sum over V). On CPU this is far cheaper than
  a sort and cumulative sum (docs/sampling.md); on TPU a sort of a 150k vocabulary is
  a bitonic network of ~150 passes.
  """
  b, v = logits_BV.shape
  block = draw_block(v)
  pad = lambda x, value: jnp.pad(x, ((0, 0), (0, -v % block)), constant_values=value)
  # Sums in two levels (blocks of ~sqrt(V), then the blocks): a float32 sum of 150k terms
  # in one pass drifts by more than one tail token's mass, the cut's resolution.
  total = lambda x_BNC: x_BNC.sum(-1).sum(-1, keepdims=True)
  m_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
  mass_BNC = pad(jnp.exp(logits_BV - m_B1), 0.0).reshape(b, -1, block)
  target_B1 = top_p * total(mass_BNC)
  # Compared as codes (padding: the lowest code, never above), no float rebuilt per halving.
  codes_BNC = pad(_order_code(logits_BV), 0).reshape(b, -1, block)
  # Invariant: the mass above lo is >= top_p (lo is below the row's minimum), the mass
  # above hi is below it (hi is the row's maximum: nothing is above it).
  lo = _order_code(jnp.min(logits_BV, axis=-1, keepdims=True)) - 1
  hi = _order_code(m_B1)

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2   # uint32: hi - lo does not overflow
    above_B1 = total(jnp.where(codes_BNC > mid[..., None], mass_BNC, 0.0))
    inside = above_B1 < target_B1
    return jnp.where(inside, lo, mid), jnp.where(inside, mid, hi)
  _, hi = jax.lax.fori_loop(0, 32, halve, (lo, hi))
  return _from_order_code(hi)


def _order_code(x: jax.Array) -> jax.Array:
  """float32 -> uint32 with the same order (-inf < ... < -0 < +0 < ... < inf)."""
  bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(1 << 31))


def _from_order_code(code: jax.Array) -> jax.Array:
  bits = jnp.where(code >> 31 == 1, code & jnp.uint32(0x7FFFFFFF), ~code)
  return jax.lax.bitcast_convert_type(bits, jnp.float32)


# x * _JUST_BELOW_ONE < x for every positive normal float32 x (it takes off >= 1 ulp).
_JUST_BELOW_ONE = 1 - 2.0**-23


def draw_categorical(logits_BV: jax.Array, rng: jax.Array, block: int = 0) -> jax.Array:
  """One token per row from softmax(logits) by inverting its CDF: token b is the first
  index whose cumulative probability exceeds a uniform draw u_b (`draw_and_normalizer`).
  """
  return draw_and_normalizer(logits_BV, rng, block)[0]


def draw_and_normalizer(logits_BV: jax.Array, rng: jax.Array, block: int = 0
                        ) -> tuple[jax.Array, jax.Array]:
  """(token [B], logsumexp of the logits [B]): `draw_categorical`'s token, and the log
  of the total mass it inverted, which the draw computes anyway.

  Exact in distribution, like `jax.random.categorical`, but it draws one random number
  per row instead of one Gumbel per vocabulary entry: on CPU a [B, V] Threefry draw is
  a large share of a decode step. The CDF is inverted in two levels: the vocabulary is cut
  into blocks of `block` entries (0: `draw_block(V)`, about sqrt(V)), u_b picks the block
  from the cumulative block masses, then the entry within that one block; so no
  cumulative sum runs over all V entries (a slow scan on CPU) and no [B, V] cumulative
  array is held. Entries at -inf (filtered) have zero
  mass and are never drawn.
  """
  b, v = logits_BV.shape
  block = block or draw_block(v)
  blocks = -(-v // block)
  m_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
  mass_BNC = jnp.pad(jnp.exp(logits_BV - m_B1), ((0, 0), (0, blocks * block - v))).reshape(
      b, blocks, block)
  below_BN = jnp.cumsum(mass_BNC.sum(-1), axis=-1)           # mass up to each block's end
  total_B1 = below_BN[:, -1:]
  # Strictly below the total (a product can round up to it), so the block found has mass.
  u_B1 = jnp.minimum(jax.random.uniform(rng, (b, 1)) * total_B1, total_B1 * _JUST_BELOW_ONE)
  n_B = jnp.minimum(jnp.sum(below_BN <= u_B1, axis=-1), blocks - 1)
  row_BC = jnp.take_along_axis(mass_BNC, n_B[:, None, None], axis=1)[:, 0]
  within_BC = jnp.cumsum(row_BC, axis=-1)
  before_B1 = jnp.take_along_axis(below_BN, n_B[:, None], axis=-1) - within_BC[:, -1:]
  # The same draw inside the block, kept within its own recomputed mass (rounding).
  u_B1 = jnp.clip(u_B1 - before_B1, 0, within_BC[:, -1:] * _JUST_BELOW_ONE)
  token_B = n_B * block + jnp.minimum(jnp.sum(within_BC <= u_B1, axis=-1), block - 1)
  return token_B, (m_B1 + jnp.log(total_B1))[:, 0]


def draw_block(vocab_size: int) -> int:
  """`draw_categorical`'s block: about sqrt(V) entries, a multiple of 128 (lanes)."""
  return 128 * max(1, round(math.sqrt(vocab_size) / 128))


def first_argmax(logits_BV: jax.Array) -> jax.Array:
  """`jnp.argmax(logits, axis=-1)` (the first index of the row's maximum) as a max and a
  min: XLA:CPU runs argmax as one (value, index) reduction, slower than two plain
  ones. A row holding NaN gives its last index (argmax: the NaN's)."""
  v = logits_BV.shape[-1]
  top_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
  first_B = jnp.min(jnp.where(logits_BV == top_B1, jnp.arange(v, dtype=jnp.int32), v), axis=-1)
  return jnp.minimum(first_B, v - 1)


def _choose(logits_BV, rng, *, temperature, top_k, top_p):
  """Returns (token [B], log-prob [B]) under the tempered policy."""
  logits_BV = logits_BV.astype(jnp.float32)
  if temperature == 0:
    token, log_z_B = first_argmax(logits_BV), jax.nn.logsumexp(logits_BV, axis=-1)
  else:
    logits_BV = logits_BV / temperature
    filtered_BV = filter_logits(logits_BV, top_k=top_k, top_p=top_p)
    token, log_z_B = draw_and_normalizer(filtered_BV, rng)
    if filtered_BV is not logits_BV:  # a filter cut mass: the policy's normaliser is apart
      log_z_B = jax.nn.logsumexp(logits_BV, axis=-1)
  # log softmax at the chosen token only: no [B, V] array of log-probs.
  chosen_B = jnp.take_along_axis(logits_BV, token[:, None], axis=-1)[:, 0]
  return token.astype(jnp.int32), chosen_B - log_z_B


def _cast_floats(state, dtype: str | None):
  if dtype is None:
    return state
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                      else x, state)


@dataclasses.dataclass(frozen=True)
class SampleSpec:
  """What one sampler call draws: static under `jax.jit` (each spec compiles once).

  `rl.rollout.sample_spec` builds it from `config.sampling` (`SamplingSettings`), the
  tokenizer's stop and pad ids, and the call's continuous-batching slots.
  """
  n: int                                 # rollouts per prompt
  max_new_tokens: int
  temperature: float
  stop_ids: tuple[int, ...]
  pad_id: int
  top_k: int = 0
  top_p: float = 1.0
  weights_dtype: str | None = None       # "bfloat16": weights cast once per call
  dtype: str | None = None               # "bfloat16": activations and caches
  num_slots: int = 0                     # > 0: continuous batching in this many rows
  min_slots: int = 0                     # > 0: halve the slots down to this many
  decode_block: int = 0                  # > 0: attend over filled cache blocks only
  interruption: Interruption | None = None  # forced interruptions; None: off
  merge_adapters: bool = True            # LoRA: decode with W + A @ B * alpha / r


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def sample(graphdef, state, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec) -> Rollouts:
  """Samples n rollouts for each of G left-padded prompts; rollout b belongs to b // n.

  Any id of `stop_ids` ends a rollout (it is kept as the rollout's last token).
  `weights_dtype` ("bfloat16") casts the weights once for the whole call; `dtype`
  ("bfloat16") runs the call's activations, hence its prompt and decode caches, in that
  dtype (`Transformer.with_dtype`; None: the model's `cfg.dtype`). Logits and the
  sampler's log-probs are float32 either way.
  `num_slots` > 0 decodes with continuous batching in that many slots (see
  `_decode_continuous`); 0 decodes all G * n rollouts in lockstep. `min_slots` > 0 lets
  continuous batching halve its slots, down to that many, once nothing is queued and at
  most half of them are busy (`slot_levels`); 0 keeps `num_slots` to the end.
  `decode_block` > 0 attends over the generated cache in blocks of that many tokens, only
  those holding tokens yet (`decode.decode_step`'s `cache_block`); the same samples.
  """
  model = _call_model(graphdef, state, spec)
  if spec.num_slots:
    first_logits_GV, prefix, prompt_len_B = _prefill(model, prompts_GP, prompt_mask_GP, spec.n)
    return _decode_continuous(
        model, decode.layer_blocks(model), prefix, first_logits_GV, prompt_len_B, rng,
        n=spec.n, num_slots=spec.num_slots, min_slots=spec.min_slots,
        max_new_tokens=spec.max_new_tokens, choose=_chooser(spec), stop_ids_K=_stop_ids(spec),
        pad_id=spec.pad_id, decode_block=spec.decode_block, interruption=spec.interruption)
  return _finish(_advance(model, _start(model, prompts_GP, prompt_mask_GP, rng, spec), spec),
                 spec)


@flax.struct.dataclass
class Decoding:
  """A lockstep sampler call in progress: `start`, then `advance` (any number of times,
  each with the weights of its choice), then `finish`."""
  loop: _LoopState
  prefix: PrefixCache
  prompt_len_B: jax.Array  # [B] int32

  @property
  def step(self) -> jax.Array:  # [] int32: tokens generated per row so far
    return self.loop.step

  @property
  def done(self) -> jax.Array:  # [B] bool
    return self.loop.done


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def start(graphdef, state, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec) -> Decoding:
  """Prefills the prompts with `state`'s weights; no token is chosen yet (lockstep only)."""
  if spec.num_slots:
    raise ValueError("sampler.start/advance decode in lockstep: spec.num_slots must be 0")
  return _start(_call_model(graphdef, state, spec), prompts_GP, prompt_mask_GP, rng, spec)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("decoding",))
def advance(graphdef, state, decoding: Decoding, until, spec: SampleSpec) -> Decoding:
  """Decodes with `state`'s weights until every row is done or `until` tokens are written.

  The cache of the tokens before keeps what earlier weights wrote (as in PipelineRL):
  switching weights between calls changes the policy from the next token on.
  """
  return _advance(_call_model(graphdef, state, spec), decoding, spec, until)


@functools.partial(jax.jit, static_argnames=("spec",))
def finish(decoding: Decoding, spec: SampleSpec) -> Rollouts:
  return _finish(decoding, spec)


def _call_model(graphdef, state, spec: SampleSpec):
  """The model one call decodes with: LoRA adapters merged into their projections
  (`merge_adapters`: once per call, faster to decode than the adapters' own products,
  the same function), weights cast to `weights_dtype`, activations in `dtype`."""
  if spec.merge_adapters:
    model = nnx.merge(graphdef, state)
    if model.cfg.lora.enabled:
      graphdef, state = nnx.split(lora.merged_model(model))
  model = nnx.merge(graphdef, _cast_floats(state, spec.weights_dtype))
  return model.with_dtype(spec.dtype) if spec.dtype else model


def _chooser(spec: SampleSpec):
  return functools.partial(_choose, temperature=spec.temperature, top_k=spec.top_k,
                           top_p=spec.top_p)


def _stop_ids(spec: SampleSpec) -> jax.Array:
  return jnp.asarray(tuple(spec.stop_ids), jnp.int32)


def _prefill(model, prompts_GP, prompt_mask_GP, n: int):
  """(first logits [G, V], the shared prompt cache, prompt lengths [G * n])."""
  prompts_GP = sharding.constrain(prompts_GP, ("batch", None))
  prompt_mask_GP = sharding.constrain(prompt_mask_GP, ("batch", None))
  first_logits_GV, prefix = decode.prefill(model, prompts_GP, prompt_mask_GP)
  return first_logits_GV, prefix, jnp.repeat(prompt_mask_GP.sum(-1), n).astype(jnp.int32)


def _start(model, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec) -> Decoding:
  n, t = spec.n, spec.max_new_tokens
  first_logits_GV, prefix, prompt_len_B = _prefill(model, prompts_GP, prompt_mask_GP, n)
  b = prompts_GP.shape[0] * n
  rows = lambda x: sharding.constrain(x, ("batch", None))
  loop = _LoopState(
      step=jnp.zeros((), jnp.int32),
      logits=sharding.constrain(jnp.repeat(first_logits_GV, n, axis=0), ("batch", "vocab")),
      tokens=rows(jnp.full((b, t), spec.pad_id, jnp.int32)),
      logprobs=rows(jnp.zeros((b, t), jnp.float32)),
      done=sharding.constrain(jnp.zeros((b,), bool), ("batch",)),
      cache=decode.init_cache(model, b, t),
      rng=rng, thinking=jnp.ones((b,), bool), interrupted=jnp.zeros((b,), bool))
  return Decoding(loop, prefix, prompt_len_B)


def _advance(model, d: Decoding, spec: SampleSpec, until=None) -> Decoding:
  """The lockstep decode loop from `d`, to the end (`until` None) or `until` tokens."""
  cut, pad_id, choose, stop_ids_K = spec.interruption, spec.pad_id, _chooser(spec), _stop_ids(spec)
  blocks = decode.layer_blocks(model)  # once, outside the decode loop
  prefix, prompt_len_B = d.prefix, d.prompt_len_B

  def body(s: _LoopState) -> _LoopState:
    rng, key = jax.random.split(s.rng)
    token, logp = choose(s.logits, key)
    interrupted, thinking = s.interrupted, s.thinking
    if cut:
      interrupted = interrupted | ((s.step == cut.think_budget) & thinking & ~s.done)
      token, logp = cut.force(s.step, interrupted, token, logp)
    token = jnp.where(s.done, pad_id, token)
    logp = jnp.where(s.done, 0.0, logp)
    tokens = s.tokens.at[:, s.step].set(token)
    logprobs = s.logprobs.at[:, s.step].set(logp)
    done = s.done | jnp.isin(token, stop_ids_K)
    if cut:
      thinking = thinking & ~cut.ends_thinking(tokens, s.step)
      done = done | (interrupted & (s.step + 1 >= cut.end))
    logits, cache = decode.decode_step(model, token, prompt_len_B + s.step, s.step, prefix,
                                       s.cache, blocks=blocks, cache_block=spec.decode_block)
    return _LoopState(step=s.step + 1, logits=sharding.constrain(logits, ("batch", "vocab")),
                      tokens=tokens, logprobs=logprobs, done=done, cache=cache, rng=rng,
                      thinking=thinking, interrupted=interrupted)

  def cond(s: _LoopState):
    running = (s.step < spec.max_new_tokens) & ~jnp.all(s.done)
    return running if until is None else running & (s.step < until)

  return d.replace(loop=jax.lax.while_loop(cond, body, d.loop))


def _finish(d: Decoding, spec: SampleSpec) -> Rollouts:
  final, cut = d.loop, spec.interruption
  written = final.step
  if cut:  # an interrupted row ends at its answer budget, whatever the others do
    written = jnp.where(final.interrupted, jnp.minimum(written, cut.end), written)
  return _rollouts(final.tokens, final.logprobs, written, _stop_ids(spec), spec.pad_id,
                   final.interrupted, cut)


def _rollouts(tokens_BT, logprobs_BT, written, stop_ids_K, pad_id, interrupted_B=None,
              interruption: Interruption | None = None) -> Rollouts:
  """Masks each row after its first stop token and from position `written` ([] or [B]) on;
  marks the interruption text of the `interrupted_B` rows as forced."""
  b, t = tokens_BT.shape
  was_written = jnp.arange(t) < jnp.asarray(written)[..., None]
  # A token is generated iff no stop token came strictly before it.
  is_stop = jnp.isin(tokens_BT, stop_ids_K) & was_written
  stops_before = jnp.cumsum(is_stop, axis=-1) - is_stop
  mask = (stops_before == 0) & was_written
  forced = (interruption.forced_mask(interrupted_B, t) & mask if interruption
            else jnp.zeros((b, t), bool))
  return Rollouts(tokens=jnp.where(mask, tokens_BT, pad_id),
                  logprobs=jnp.where(mask, logprobs_BT, 0.0), mask=mask,
                  finished=jnp.any(is_stop, axis=-1), forced=forced)


@flax.struct.dataclass
class _Slots:
  """Continuous batching state, per data-parallel shard d of D: S slots, R rollouts."""
  rollout: jax.Array    # [D, S] int32 rollout (shard-local id) in the slot; R: empty
  position: jax.Array   # [D, S] int32 index of `token` among the rollout's tokens
  token: jax.Array      # [D, S] int32 the token the slot feeds this iteration
  taken: jax.Array      # [D] int32 how many queue entries have been handed a slot
  tokens: jax.Array     # [D, R, T] int32
  logprobs: jax.Array   # [D, R, T] float32
  lengths: jax.Array    # [D, R] int32 tokens written per rollout
  cache: DecodeCache    # L x [D * S, K, H, T] keys, L x [D * S, K, T, H] values
  rng: jax.Array
  thinking: jax.Array     # [D, R] bool, no end-of-thinking marker yet
  interrupted: jax.Array  # [D, R] bool, the interruption text was forced in


def _refill(rollout_S, position_S, token_S, finished_S, queue_R, queued, taken, first_R):
  """One shard: finished slots take the next queued rollouts (empty when none is left)."""
  r = queue_R.shape[0]
  rank_S = jnp.cumsum(finished_S) - 1
  index_S = taken + rank_S
  new_S = jnp.where(index_S < queued, queue_R[jnp.minimum(index_S, r - 1)], r)
  rollout_S = jnp.where(finished_S, new_S, rollout_S)
  position_S = jnp.where(finished_S | (rollout_S == r), 0, position_S + 1)
  token_S = jnp.where(finished_S, first_R[jnp.minimum(new_S, r - 1)], token_S)
  return rollout_S, position_S, token_S, taken + finished_S.sum()


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
  d, s = st.rollout.shape
  # Busy slots first, in their order; a stable sort keeps the empty ones after them.
  keep_DS = jnp.argsort(st.rollout == empty, axis=-1, stable=True)[:, :slots]
  pick = jax.vmap(lambda x, i: x[i])
  # Each layer's cache [D * S, ...] is gathered on each shard's own rows.
  rows = lambda c: pick(c.reshape(d, s, *c.shape[1:]), keep_DS).reshape(d * slots, *c.shape[1:])
  cache = jax.tree.map(rows, st.cache).constrain()
  return st.replace(rollout=pick(st.rollout, keep_DS), position=pick(st.position, keep_DS),
                    token=pick(st.token, keep_DS), cache=cache)


def _decode_continuous(model, blocks, prefix, first_logits_GV, prompt_len_B, rng, *, n, num_slots,
                       min_slots, max_new_tokens, choose, stop_ids_K, pad_id,
                       decode_block, interruption: Interruption | None = None) -> Rollouts:
  """Continuous batching: `num_slots` decode rows refilled as rollouts finish.

  The first token of every rollout is drawn from its prompt's prefill logits up front.
  Rollouts that do not stop there are queued; each data-parallel shard (D of them,
  the `batch` split of the mesh) owns its G / D groups and num_slots / D slots and
  runs its own queue. An iteration feeds every busy slot's token, draws the next, and
  hands the slots whose rollout just ended (stop id, or `max_new_tokens` reached) to
  the next queued rollouts of the shard, whose prompt keys/values are read from the
  shared prompt cache (no prefill is repeated). The loop ends when every slot is empty,
  so the iterations track the total number of tokens, not B times the longest rollout.

  With `min_slots`, the loop at S slots per shard also ends once every shard's queue is
  empty and at most S / 2 of its slots are busy; those move, with their caches, into
  S / 2 slots (`_compact`) and a loop at S / 2 goes on, down to `slot_levels`' last
  count. Where a decode step costs in proportion to its rows (CPU), the long rollouts
  of an uneven batch then no longer carry S - 1 mostly empty rows; each level is one
  more compiled loop body.
  Each rollout sees the same conditionals as in lockstep decoding; only the random
  keys differ, so greedy decoding is identical and sampling equal in distribution.
  """
  g = first_logits_GV.shape[0]
  b, t = g * n, max_new_tokens
  d = sharding.batch_shards(jax.sharding.get_abstract_mesh())
  if g % d or num_slots % d:
    raise ValueError(f"continuous batching on {d} data-parallel shards needs groups ({g}) "
                     f"and sampling.decode_slots ({num_slots}) divisible by {d}")
  r, s = b // d, num_slots // d
  shard = lambda x: sharding.constrain(x.reshape(d, -1, *x.shape[1:]),
                                       ("batch",) + (None,) * x.ndim)
  rng, first_key = jax.random.split(rng)
  # n draws from each prompt's logits (not one draw from logits repeated n times: XLA:CPU
  # fuses that repeat into the argmax reduction, which LLVM is very slow to compile).
  first_NG, first_logp_NG = jax.vmap(choose, in_axes=(None, 0))(
      first_logits_GV, jax.random.split(first_key, n))
  first_B, first_logp_B = first_NG.T.reshape(b), first_logp_NG.T.reshape(b)
  tokens = shard(jnp.full((b, t), pad_id, jnp.int32).at[:, 0].set(first_B))
  logprobs = shard(jnp.zeros((b, t), jnp.float32).at[:, 0].set(first_logp_B))
  first_DR = shard(first_B)
  needs_decode_DR = ~jnp.isin(first_DR, stop_ids_K) & (t > 1)
  queue = jnp.argsort(~needs_decode_DR, axis=-1, stable=True).astype(jnp.int32)
  queued = needs_decode_DR.sum(-1).astype(jnp.int32)
  start = jnp.arange(s)
  rollout = jnp.where(start < queued[:, None], queue[:, jnp.minimum(start, r - 1)], r)
  prompt_len_DR = shard(prompt_len_B)
  by_shard = jax.vmap(lambda x, i: x[jnp.minimum(i, r - 1)])

  def body(st: _Slots) -> _Slots:
    rng, key = jax.random.split(st.rng)
    slots = st.rollout.shape[1]
    flat = lambda x: x.reshape(-1)
    logits, cache = decode.decode_step(
        model, flat(st.token), flat(by_shard(prompt_len_DR, st.rollout) + st.position),
        flat(st.position), prefix, st.cache, blocks=blocks,
        groups_DS=jnp.minimum(st.rollout, r - 1) // n, cache_block=decode_block)
    token, logp = choose(sharding.constrain(logits, ("batch", "vocab")), key)
    token, logp = token.reshape(d, slots), logp.reshape(d, slots)
    # Empty slots (rollout r) decode a dummy row and write nowhere.
    put = jax.vmap(lambda a, i, j, v: a.at[i, j].set(v, mode="drop"))
    set_rows = jax.vmap(lambda a, i, v: a.at[i].set(v, mode="drop"))
    busy, chosen_at = st.rollout < r, st.position + 1   # [D, S]
    thinking, interrupted = st.thinking, st.interrupted
    if interruption:
      slot_interrupted = by_shard(interrupted, st.rollout) | (
          (chosen_at == interruption.think_budget) & by_shard(thinking, st.rollout) & busy)
      token, logp = interruption.force(chosen_at, slot_interrupted, token, logp)
      interrupted = set_rows(interrupted, st.rollout, slot_interrupted)
    finished = busy & (jnp.isin(token, stop_ids_K) | (chosen_at + 1 >= t))
    if interruption:
      finished = finished | (busy & slot_interrupted & (chosen_at + 1 >= interruption.end))
    tokens = put(st.tokens, st.rollout, chosen_at, token)
    if interruption:
      ended = interruption.ends_thinking(by_shard(tokens, st.rollout), chosen_at)
      thinking = set_rows(thinking, st.rollout, by_shard(thinking, st.rollout) & ~ended)
    lengths = set_rows(st.lengths, jnp.where(finished, st.rollout, r), chosen_at + 1)
    rollout, position, token_next, taken = jax.vmap(_refill)(
        st.rollout, st.position, token, finished, queue, queued, st.taken, first_DR)
    return _Slots(rollout=rollout, position=position, token=token_next, taken=taken,
                  tokens=tokens, logprobs=put(st.logprobs, st.rollout, chosen_at, logp),
                  lengths=lengths, cache=cache, rng=rng, thinking=thinking,
                  interrupted=interrupted)

  def running_until(fewer: int):
    """Loop condition: a slot is busy, and (fewer > 0) the shards cannot move to fewer."""
    def cond(st: _Slots):
      busy_D = jnp.sum(st.rollout < r, axis=-1)
      if not fewer:
        return jnp.any(busy_D > 0)
      return jnp.any(busy_D > 0) & ~jnp.all((st.taken >= queued) & (busy_D <= fewer))
    return cond

  thinking = jnp.ones((d, r), bool)
  if interruption:  # a one-token marker may be the first token
    thinking = ~interruption.ends_thinking(tokens, 0)
  st = _Slots(rollout=rollout, position=jnp.zeros((d, s), jnp.int32),
              token=by_shard(first_DR, rollout), taken=jnp.minimum(queued, s),
              tokens=tokens, logprobs=logprobs, lengths=jnp.ones((d, r), jnp.int32),
              cache=decode.init_cache(model, num_slots, t), rng=rng, thinking=thinking,
              interrupted=jnp.zeros((d, r), bool))
  levels = slot_levels(s, -(-min_slots // d))
  for fewer in levels[1:]:
    st = _compact(jax.lax.while_loop(running_until(fewer), body, st), fewer, r)
  final = jax.lax.while_loop(running_until(0), body, st)
  unshard = lambda x: x.reshape(b, *x.shape[2:])
  return _rollouts(unshard(final.tokens), unshard(final.logprobs), unshard(final.lengths),
                   stop_ids_K, pad_id, unshard(final.interrupted), interruption)


def prefix_cache_for_rollouts(prefix: PrefixCache, n: int) -> PrefixCache:
  """The same cache copied per rollout (what sharing avoids); used by tests."""
  return jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), prefix)  # all [G, ...]
