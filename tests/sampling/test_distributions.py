"""The sampler's draws: top-k / top-p against NumPy, draws against the exact softmax."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from isojax.sampling import distributions
from isojax.sampling.spec import SampleSpec


def _np_filter(logits, top_p):
  """Nucleus filter by a plain loop over tokens in descending order."""
  out = logits.copy()
  for row in out:
    order = np.argsort(-row, kind="stable")
    probs = np.exp(row - row.max())
    probs /= probs.sum()
    dropped = np.zeros(row.shape, bool)
    mass = 0.0
    for i in order:
      if mass >= top_p:
        dropped[i] = True
      mass += probs[i]
    row[dropped] = -np.inf
  return out


@pytest.mark.parametrize("top_k,top_p", [(0, 0.5), (3, 1.0), (4, 0.7), (0, 1.0), (7, 0.9), (2, 0.3)])
def test_filter_logits_matches_numpy(top_k, top_p):
  logits = np.random.default_rng(top_k).normal(size=(4, 9)).astype(np.float32)
  got = np.asarray(distributions.filter_logits(jnp.asarray(logits), top_k=top_k, top_p=top_p))
  np.testing.assert_array_equal(np.isinf(got), np.isinf(_np_filter_combined(logits, top_k, top_p)))


@pytest.mark.parametrize("top_p", [1e-3, 0.3, 0.9, 0.99])
def test_nucleus_without_top_k_matches_numpy_on_a_large_vocabulary(top_p):
  """Top-p alone (`nucleus_threshold`'s bisection) against the plain loop over ranked
  tokens: wide and peaked rows, rows of tied logits, and rows with -inf entries. Rows
  where some token's mass before it lies within 1e-5 of top_p are left out: float32
  sums in any order can put it on either side (the sorting version did too)."""
  rng = np.random.default_rng(7)
  wide = rng.normal(size=(6, 1000)) * 2
  peaked = rng.normal(size=(6, 1000)) * 8
  tied = np.round(rng.normal(size=(6, 1000)) * 2)          # few distinct values
  padded = rng.normal(size=(6, 1000))
  padded[:, 900:] = -np.inf                                 # e.g. padded vocabulary
  logits = np.concatenate([wide, peaked, tied, padded]).astype(np.float32)
  ranked = -np.sort(-logits.astype(np.float64), axis=-1)
  probs = np.exp(ranked - ranked[:, :1])
  probs /= probs.sum(-1, keepdims=True)
  clear = np.abs(np.cumsum(probs, -1) - probs - top_p).min(-1) > 1e-5
  assert clear.sum() >= 16
  logits = logits[clear]
  got = np.asarray(distributions.filter_logits(jnp.asarray(logits), top_k=0, top_p=top_p))
  # The loop keeps the first of tied logits in its order; the filter keeps every token
  # tied with the smallest kept logit (no order among equals).
  smallest_kept = np.where(np.isinf(_np_filter(logits, top_p)), np.inf, logits).min(-1)
  want = logits >= smallest_kept[:, None]
  np.testing.assert_array_equal(~np.isinf(got), want)
  np.testing.assert_array_equal(got[want], logits[want])
  assert (~np.isinf(got)).sum(-1).min() >= 1


def test_order_codes_sort_like_the_floats_and_invert():
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.normal(size=500) * 10.0 ** rng.integers(-30, 30, 500),
                      [-np.inf, np.inf, 0.0, -0.0, 1e-45, -1e-45]]).astype(np.float32)
  codes = np.asarray(distributions._order_code(jnp.asarray(x)))
  by_code = np.argsort(codes)
  assert np.all(np.diff(x[by_code]) >= 0)                  # floats in order (-0 == +0)
  assert len(np.unique(codes)) == len(np.unique(x.view(np.uint32)))   # one code per float
  back = np.asarray(distributions._from_order_code(jnp.asarray(codes)))
  np.testing.assert_array_equal(back.view(np.uint32), x.view(np.uint32))


def test_nucleus_without_top_k_sorts_nothing():
  compiled = jax.jit(functools.partial(distributions.filter_logits, top_k=0, top_p=0.9)).lower(
      jax.ShapeDtypeStruct((4, 512), jnp.float32)).compile().as_text()
  assert " sort(" not in compiled and "sort." not in compiled


def _np_filter_combined(logits, top_k, top_p):
  """Top-k first, then the nucleus of the renormalised survivors."""
  out = logits.copy()
  if top_k:
    kth = np.sort(out, axis=-1)[:, -top_k][:, None]
    out[out < kth] = -np.inf
  return _np_filter(out, top_p) if top_p < 1 else out


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.8)])
def test_sampled_tokens_follow_the_tempered_filtered_softmax(top_k, top_p):
  """20,000 draws of one step against the exact probabilities: chi-square goodness of fit."""
  logits_V = np.random.default_rng(1).normal(scale=1.5, size=12).astype(np.float32)
  rows = 20_000
  spec = SampleSpec(n=1, max_new_tokens=1, temperature=0.7, stop_ids=(), pad_id=0,
                    top_k=top_k, top_p=top_p)
  tokens, _ = distributions.choose(jnp.tile(logits_V, (rows, 1)), jax.random.key(3), spec)
  scaled = logits_V.astype(np.float64) / 0.7
  kept = ~np.isinf(_np_filter_combined(scaled[None], top_k, top_p)[0])
  probs = np.where(kept, np.exp(scaled - scaled.max()), 0.0)
  probs /= probs.sum()
  counts = np.bincount(np.asarray(tokens), minlength=12)
  assert counts[~kept].sum() == 0
  assert stats.chisquare(counts[kept], rows * probs[kept]).pvalue > 1e-3


@pytest.mark.parametrize("block", [1, 7, 64, 128])
def test_two_level_draw_follows_softmax_across_blocks(block):
  """300 entries cut into blocks of `block` (the last one partial): 30,000 draws against
  softmax, chi-square; filtered entries, including a whole filtered block, never drawn."""
  v, rows = 300, 30_000
  logits_V = np.random.default_rng(2).normal(scale=2.0, size=v).astype(np.float32)
  logits_V[::3] = -np.inf
  logits_V[140:200] = -np.inf
  tokens = distributions.draw_categorical(jnp.tile(jnp.asarray(logits_V), (rows, 1)),
                                    jax.random.key(5), block=block)
  kept = np.isfinite(logits_V)
  probs = np.exp(logits_V[kept].astype(np.float64) - logits_V[kept].max())
  probs /= probs.sum()
  counts = np.bincount(np.asarray(tokens), minlength=v)
  assert counts.sum() == rows and counts[~kept].sum() == 0
  # Pool the rarest entries so every expected count is at least 5.
  order = np.argsort(probs)
  expected, observed = rows * probs[order], counts[kept][order]
  rare = np.cumsum(expected) < 5 * 10
  stat = np.append(observed[~rare], observed[rare].sum()), np.append(expected[~rare],
                                                                     expected[rare].sum())
  assert stats.chisquare(*stat).pvalue > 1e-3


@pytest.mark.parametrize("u", [0.0, 0.5, np.nextafter(np.float32(1), np.float32(0))])
def test_two_level_draw_lands_on_the_only_token_with_mass(monkeypatch, u):
  """One finite logit (first, inside, last of a block, last of a partial block) is drawn
  whatever the uniform number, the largest float32 below 1 included."""
  monkeypatch.setattr(jax.random, "uniform",
                      lambda rng, shape: jnp.full(shape, u, jnp.float32))
  v = 1000
  for position in (0, 127, 128, 555, v - 1):
    logits_BV = jnp.full((4, v), -jnp.inf).at[:, position].set(3.0)
    tokens = distributions.draw_categorical(logits_BV, jax.random.key(0), block=128)
    np.testing.assert_array_equal(np.asarray(tokens), position)


def test_two_level_draw_inverts_the_cdf_exactly():
  """With the uniform number fixed, the token is the first whose float64 CDF exceeds it."""
  logits_V = np.random.default_rng(4).normal(size=500).astype(np.float32)
  probs = np.exp(logits_V.astype(np.float64) - logits_V.max())
  cdf = np.cumsum(probs / probs.sum())
  for u in np.linspace(0.001, 0.999, 37):
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(jax.random, "uniform",
                    lambda rng, shape, u=u: jnp.full(shape, u, jnp.float32))
      token = int(distributions.draw_categorical(jnp.asarray(logits_V)[None], jax.random.key(0),
                                           block=64)[0])
    expected = int(np.searchsorted(cdf, u, side="right"))
    # float32 sums: a draw within rounding of a CDF step may land on its neighbour.
    assert token == expected or min(abs(cdf[token - 1] - u), abs(cdf[token] - u)) < 1e-5


@pytest.mark.parametrize("block", [1, 7, 64, 128])
def test_draw_normalizer_is_the_logsumexp(block):
  """The log of the mass the draw inverts is logsumexp of the row (float64 reference),
  with filtered (-inf) entries contributing nothing."""
  logits_BV = np.random.default_rng(block).normal(scale=4.0, size=(6, 300)).astype(np.float32)
  logits_BV[1, ::3] = -np.inf
  logits_BV[2, :250] = -np.inf
  _, log_z_B = distributions.draw_and_normalizer(jnp.asarray(logits_BV), jax.random.key(0), block)
  expected = special.logsumexp(logits_BV.astype(np.float64), axis=-1)
  np.testing.assert_allclose(np.asarray(log_z_B), expected, rtol=1e-6, atol=1e-5)


def test_draw_block_is_about_the_square_root_of_the_vocabulary():
  assert distributions.draw_block(12) == 128
  assert distributions.draw_block(8192) == 128
  assert distributions.draw_block(151_936) == 384   # Qwen2.5 / Qwen3: 396 blocks
  assert distributions.draw_block(128_256) == 384   # Llama 3


def test_first_argmax_equals_numpy_argmax_with_ties():
  """Integer-valued logits tie often: the first index of the maximum, as np.argmax."""
  logits = np.random.default_rng(6).integers(-3, 4, size=(50, 37)).astype(np.float32)
  logits[7] = -np.inf
  logits[8, 5:] = np.inf
  got = np.asarray(distributions.first_argmax(jnp.asarray(logits)))
  np.testing.assert_array_equal(got, np.argmax(logits, axis=-1))
  assert int(distributions.first_argmax(jnp.asarray([[0.0, np.nan, 1.0]]))[0]) == 2  # in range
