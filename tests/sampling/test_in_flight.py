"""Decoding in segments (`sampler.start` / `advance` / `finish`), with the weights
switched between segments as PipelineRL's in-flight updates do."""

import jax
import numpy as np
import pytest
from flax import nnx

from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import rollout
from isojax.sampling import sampler

PAD, STOP, T = 0, (8,), 12


def _weights(scale):
  cfg = ModelConfig(vocab_size=23, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                    head_dim=8, mlp_dim=48, qk_norm=True, qkv_bias=True)
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  return nnx.graphdef(model), jax.tree.map(lambda x: x * scale if x.ndim == 2 else x,
                                           nnx.state(model))


def _prompts(g=6, p=6):
  rng = np.random.default_rng(2)
  lengths = rng.integers(2, p + 1, g)
  mask = np.arange(p)[None] >= (p - lengths)[:, None]
  return np.where(mask, rng.integers(1, 23, (g, p)), PAD).astype(np.int32), mask


def _spec(temperature):
  return sampler.SampleSpec(n=2, max_new_tokens=T, temperature=temperature, stop_ids=STOP,
                            pad_id=PAD)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_segments_with_the_same_weights_equal_one_call(temperature):
  graphdef, state = _weights(8.0)
  prompts, mask = _prompts()
  key, spec = jax.random.key(4), _spec(temperature)
  whole = jax.tree.map(np.asarray, sampler.sample(graphdef, state, prompts, mask, key, spec))
  decoding = sampler.start(graphdef, state, prompts, mask, key, spec)
  for until in (1, 4, 5, T):
    decoding = sampler.advance(graphdef, state, decoding, until, spec)
    assert int(decoding.step) == min(until, T) or bool(np.asarray(decoding.done).all())
  parts = jax.tree.map(np.asarray, sampler.finish(decoding, spec))
  for name in ("tokens", "logprobs", "mask", "finished", "forced"):
    np.testing.assert_array_equal(getattr(parts, name), getattr(whole, name), name)


def test_switched_weights_act_from_the_next_token_and_versions_follow():
  """Weights A for the first segment of 3 steps, then B: tokens 0..3 are A's (token 3
  is drawn from logits A computed), later tokens B's; the rollout-level call reports
  each rollout's oldest and newest version by the same rule."""
  graphdef, a = _weights(8.0)
  _, b = _weights(-8.0)
  prompts, mask = _prompts()
  key, spec = jax.random.key(0), _spec(0.0)
  only_a = jax.tree.map(np.asarray, sampler.sample(graphdef, a, prompts, mask, key, spec))
  only_b = jax.tree.map(np.asarray, sampler.sample(graphdef, b, prompts, mask, key, spec))
  reads = []

  def weights():
    reads.append(len(reads))
    return (0, a) if len(reads) <= 2 else (1, b)  # start and the first segment: A

  out, versions = rollout._decode_in_flight(graphdef, rollout.InFlight(weights, 3), prompts,
                                            mask, key, spec)
  out = jax.tree.map(np.asarray, out)
  lengths = out.mask.sum(-1)
  np.testing.assert_array_equal(out.tokens[:, :4] * out.mask[:, :4],
                                only_a.tokens[:, :4] * out.mask[:, :4])
  assert (out.tokens != only_a.tokens).any() and (out.tokens != only_b.tokens).any()
  np.testing.assert_array_equal(versions[:, 0], 0)
  np.testing.assert_array_equal(versions[:, 1], np.where(lengths >= 5, 1, 0))
  assert (versions[:, 1] > versions[:, 0]).any() and (versions[:, 1] == 0).any()
