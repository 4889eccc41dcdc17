"""The policy's distribution over the next token, and cheap ways to draw from it.

The sampler's policy is softmax(logits / temperature), restricted by top-k and top-p;
`choose` draws one token per row from it and returns the token's log-probability under
the untruncated tempered policy (what the trainer recomputes; temperature 0: greedy,
with the untempered log-prob). Every decoding schedule calls `choose`, so the draws
live here once. The rest is speed on CPU, kept exact: top-p without a sort
(`nucleus_threshold` bisects over the ordered float32 codes), one uniform number per
row instead of a Gumbel per vocabulary entry (`draw_and_normalizer` inverts the CDF in
two levels), argmax as a max and a min (`first_argmax`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from isojax.sampling.spec import SampleSpec


def filter_logits(logits_BV: jax.Array, *, top_k: int, top_p: float) -> jax.Array:
  """Sets logits outside the top-k and outside the top-p nucleus to -inf.

  Nothing is sorted: top-k uses `lax.top_k` (a partial selection), and with top-k on,
  the nucleus is found among those k candidates; top-p alone finds its cut by bisection
  (`nucleus_threshold`). With both off it returns `logits_BV` itself.
  """
  v = logits_BV.shape[-1]
  top_k = top_k if 0 < top_k < v else 0
  if top_k:
    candidates = jax.lax.top_k(logits_BV, top_k)[0]       # [B, top_k], descending
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
  total = lambda x_BJC: x_BJC.sum(-1).sum(-1, keepdims=True)
  m_B1 = jnp.max(logits_BV, axis=-1, keepdims=True)
  mass_BJC = pad(jnp.exp(logits_BV - m_B1), 0.0).reshape(b, -1, block)
  target_B1 = top_p * total(mass_BJC)
  # Compared as codes (padding: the lowest code, never above), no float rebuilt per halving.
  codes_BJC = pad(_order_code(logits_BV), 0).reshape(b, -1, block)
  # Invariant: the mass above lo is >= top_p (lo is below the row's minimum), the mass
  # above hi is below it (hi is the row's maximum: nothing is above it).
  lo = _order_code(jnp.min(logits_BV, axis=-1, keepdims=True)) - 1
  hi = _order_code(m_B1)

  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2   # uint32: hi - lo does not overflow
    above_B1 = total(jnp.where(codes_BJC > mid[..., None], mass_BJC, 0.0))
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
  mass_BJC = jnp.pad(jnp.exp(logits_BV - m_B1), ((0, 0), (0, blocks * block - v))).reshape(
      b, blocks, block)
  below_BJ = jnp.cumsum(mass_BJC.sum(-1), axis=-1)           # mass up to each block's end
  total_B1 = below_BJ[:, -1:]
  # Strictly below the total (a product can round up to it), so the block found has mass.
  u_B1 = jnp.minimum(jax.random.uniform(rng, (b, 1)) * total_B1, total_B1 * _JUST_BELOW_ONE)
  j_B = jnp.minimum(jnp.sum(below_BJ <= u_B1, axis=-1), blocks - 1)
  row_BC = jnp.take_along_axis(mass_BJC, j_B[:, None, None], axis=1)[:, 0]
  within_BC = jnp.cumsum(row_BC, axis=-1)
  before_B1 = jnp.take_along_axis(below_BJ, j_B[:, None], axis=-1) - within_BC[:, -1:]
  # The same draw inside the block, kept within its own recomputed mass (rounding).
  u_B1 = jnp.clip(u_B1 - before_B1, 0, within_BC[:, -1:] * _JUST_BELOW_ONE)
  token_B = j_B * block + jnp.minimum(jnp.sum(within_BC <= u_B1, axis=-1), block - 1)
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


def choose(logits_BV, rng, spec: SampleSpec):
  """Returns (token [B], log-prob [B]) under the spec's tempered policy."""
  temperature, top_k, top_p = spec.temperature, spec.top_k, spec.top_p
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
