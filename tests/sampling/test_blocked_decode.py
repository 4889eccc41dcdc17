"""Blocked attention over the generated cache (`sampling.decode_block`).

A decode step attends only to the blocks of its generated cache that hold tokens; the
slots left out are masked in the whole-cache computation, so the samples must be the
same: greedy tokens exactly, log-probs to float rounding (the softmax sums fewer
zeros), in lockstep and with continuous batching.
"""

import jax
import numpy as np
import pytest
from flax import nnx

from isojax.config import config_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.sampling import sampler, settings

PAD = 0


def _model():
  cfg = ModelConfig(vocab_size=23, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                    head_dim=8, mlp_dim=48, qkv_bias=True)
  model = Transformer(cfg, rngs=nnx.Rngs(5))
  # Larger weights: peaked next-token distributions, so rollouts stop at uneven lengths.
  state = jax.tree.map(lambda x: x * 6.0 if x.ndim == 2 else x, nnx.state(model))
  return nnx.graphdef(model), state


def _sample(block, *, slots=0, temperature=0.0, key=0, t=11):
  graphdef, state = _model()
  rng = np.random.default_rng(2)
  lengths = rng.integers(2, 7, 6)
  mask = np.arange(6)[None] >= (6 - lengths)[:, None]
  prompts = np.where(mask, rng.integers(1, 23, (6, 6)), PAD).astype(np.int32)
  out = sampler.sample(graphdef, state, prompts, mask, jax.random.key(key),
      sampler.SampleSpec(n=3, max_new_tokens=t, temperature=temperature, stop_ids=(3, 17),
                         pad_id=PAD, num_slots=slots, decode_block=block))
  return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize("slots", [0, 5])
@pytest.mark.parametrize("block", [
    pytest.param(b, marks=pytest.mark.slow("one compiled sampler per block size"))
    for b in (1, 3, 11, 64)] + [4])
def test_greedy_samples_equal_whole_cache_attention(block, slots):
  whole = _sample(0, slots=slots)
  blocked = _sample(block, slots=slots)
  lengths = whole.mask.sum(-1)
  assert len(set(lengths.tolist())) > 2 and lengths.max() == 11  # uneven, some run to T
  for name in ("tokens", "mask", "finished"):
    np.testing.assert_array_equal(getattr(blocked, name), getattr(whole, name), name)
  np.testing.assert_allclose(blocked.logprobs, whole.logprobs, atol=1e-5)


def test_sampled_log_probs_equal_whole_cache_attention():
  """Temperature 1, same key: the same draws wherever the log-probs agree (they do to
  1e-5, so a draw could only differ at a CDF boundary)."""
  whole = _sample(0, temperature=1.0, key=3)
  blocked = _sample(4, temperature=1.0, key=3)
  same = (blocked.tokens == whole.tokens).all(-1)
  assert same.mean() > 0.9
  np.testing.assert_allclose(blocked.logprobs[same], whole.logprobs[same], atol=1e-5)


def _conds(jaxpr) -> list[int]:
  """Branch counts of every `cond` in a (closed) jaxpr, nested ones included."""
  found = []
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "cond":
      found.append(len(eqn.params["branches"]))
    for value in eqn.params.values():
      for sub in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          found += _conds(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          found += _conds(sub)
  return found


def test_a_step_chooses_among_the_attended_lengths():
  """Each layer of the decode step holds one switch over ceil(T / block) attention
  lengths (2 layers, T = 10, block 4: lengths 4, 8, 10)."""
  graphdef, state = _model()
  prompts, mask = np.ones((2, 4), np.int32), np.ones((2, 4), bool)
  trace = lambda block: jax.make_jaxpr(lambda s: sampler.sample(
      graphdef, s, prompts, mask, jax.random.key(0), sampler.SampleSpec(n=2, max_new_tokens=10,
                                                                        temperature=1.0,
                                                                        stop_ids=(3,), pad_id=PAD,
                                                                        decode_block=block)))(state)
  assert _conds(trace(4).jaxpr) == [3, 3]
  assert _conds(trace(0).jaxpr) == []


def test_attended_lengths():
  assert settings.attended_lengths(10, 0) == (10,)
  assert settings.attended_lengths(10, 4) == (4, 8, 10)
  assert settings.attended_lengths(12, 4) == (4, 8, 12)
  assert settings.attended_lengths(10, 16) == (10,)
  with pytest.raises(ValueError, match="decode_block=-1"):
    settings.attended_lengths(10, -1)
  with pytest.raises(ValueError, match=r"decode_block=2 cuts a cache of 8192 .* at least 128"):
    settings.attended_lengths(8192, 2)


@pytest.mark.parametrize("value, match", [(-4, "expected an integer >= 0"), (True, "an integer"),
                                           (1, "at most 64")])
def test_config_rejects_bad_decode_block(value, match):
  config = config_lib.base_config()
  config.num_steps = 1
  config.sampling.max_new_tokens = 256
  config.sampling.decode_block = value
  with pytest.raises(ValueError, match=f"sampling.decode_block.*{match}"):
    config_lib.resolve(config)
