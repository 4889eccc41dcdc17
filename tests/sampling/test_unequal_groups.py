"""Unequal groups: prompt g sampled `sizes[g]` times in one call, each rollout against its
own prompt's cache, checked against an uncached forward pass and against one call per
prompt."""

import jax
import numpy as np
import pytest
from flax import nnx

from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import update
from isojax.sampling import sampler

EOS, PAD = 2, 0
SIZES = (1, 4, 2, 3)  # B = 10 rollouts of 4 prompts, at most 4 of one


def _split_model():
  cfg = ModelConfig(vocab_size=23, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                    head_dim=8, mlp_dim=48, qk_norm=True, qkv_bias=True)
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  # Larger weights than the init, so logits are far from uniform and argmax is stable.
  state = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, nnx.state(model))
  return nnx.graphdef(model), state


def _prompts():
  """Four left-padded prompts of different lengths and contents."""
  tokens = np.array([[PAD, PAD, 5, 6, 7], [3, 4, 8, 9, 10], [PAD, 11, 12, 13, 14],
                     [PAD, PAD, PAD, 15, 16]], np.int32)
  return tokens, tokens != PAD


def _spec(n, num_slots=0, temperature=0.6):
  return sampler.SampleSpec(n=n, max_new_tokens=7, temperature=temperature,
                            stop_ids=(EOS,), pad_id=PAD, num_slots=num_slots)


def test_group_index_lays_each_prompts_rollouts_side_by_side():
  np.testing.assert_array_equal(sampler.group_index(SIZES, 4),
                                [0, 1, 1, 1, 1, 2, 2, 3, 3, 3])
  # Two shards: prompts 0-1 and 2-3 must hold the same number of rollouts (5 and 5).
  np.testing.assert_array_equal(sampler.group_index(SIZES, 4, shards=2),
                                sampler.group_index(SIZES, 4))
  with pytest.raises(ValueError, match=r"same number of rollouts \(they hold \[6, 4\]\)"):
    sampler.group_index((2, 4, 1, 3), 4, shards=2)
  with pytest.raises(ValueError, match="expected each in 1..3"):
    sampler.group_index(SIZES, 3)
  with pytest.raises(ValueError, match="expected each in 1..4"):
    sampler.group_index((0, 4, 2, 3), 4)


@pytest.mark.parametrize("num_slots", [0, 3])
def test_each_rollouts_logprobs_are_its_own_prompts(num_slots):
  """The sampler's log-prob of every generated token equals the tempered log-softmax of
  an uncached forward pass over the rollout's own prompt and tokens (lockstep, and
  continuous batching in 3 slots)."""
  graphdef, state = _split_model()
  prompts, mask = _prompts()
  group_B = sampler.group_index(SIZES, 4)
  out = jax.tree.map(np.asarray, sampler.sample(
      graphdef, state, prompts, mask, jax.random.key(1), _spec(4, num_slots), group_B))
  assert out.tokens.shape == (sum(SIZES), 7)
  seq = np.concatenate([prompts[group_B], out.tokens], axis=1)
  seq_mask = np.concatenate([mask[group_B], out.mask], axis=1)
  scores = np.asarray(update.score(graphdef, state, seq, seq_mask,
                                   prompt_len=prompts.shape[1], temperature=0.6))
  np.testing.assert_allclose(scores[out.mask], out.logprobs[out.mask], atol=1e-4)
  # The rollouts of one prompt are drawn independently: prompt 1's four differ.
  assert len({tuple(row) for row in out.tokens[1:5]}) > 1


@pytest.mark.parametrize("num_slots", [0, 3])
def test_greedy_rollouts_equal_each_prompts_own_greedy_rollout(num_slots):
  graphdef, state = _split_model()
  prompts, mask = _prompts()
  group_B = sampler.group_index(SIZES, 4)
  unequal = sampler.sample(graphdef, state, prompts, mask, jax.random.key(0),
                           _spec(4, num_slots, temperature=0.0), group_B)
  for g, size in enumerate(SIZES):  # one call per prompt, uniform, one rollout
    alone = sampler.sample(graphdef, state, prompts[g:g + 1], mask[g:g + 1],
                           jax.random.key(0), _spec(1, temperature=0.0))
    rows = np.flatnonzero(group_B == g)
    assert len(rows) == size
    for row in rows:
      np.testing.assert_array_equal(np.asarray(unequal.tokens[row]), np.asarray(alone.tokens[0]))
      np.testing.assert_array_equal(np.asarray(unequal.mask[row]), np.asarray(alone.mask[0]))


def test_continuous_batching_with_equal_groups_draws_what_the_uniform_call_draws():
  """`group_B` laid out as n per prompt takes the same random draws as a call without
  it: the same tokens."""
  graphdef, state = _split_model()
  prompts, mask = _prompts()
  uniform = sampler.sample(graphdef, state, prompts, mask, jax.random.key(5),
                           _spec(3, num_slots=4, temperature=1.0))
  as_groups = sampler.sample(graphdef, state, prompts, mask, jax.random.key(5),
                             _spec(3, num_slots=4, temperature=1.0),
                             sampler.group_index((3, 3, 3, 3), 3))
  np.testing.assert_array_equal(np.asarray(as_groups.tokens), np.asarray(uniform.tokens))
  np.testing.assert_allclose(np.asarray(as_groups.logprobs), np.asarray(uniform.logprobs),
                             atol=1e-5)


@pytest.mark.slow("compiles the sampler for one and for four data shards, in a subprocess")
def test_unequal_groups_on_four_data_shards_sample_from_their_own_prompts(on_8_devices):
  """Each shard decodes its own prompts' rollouts (sizes balanced per shard: 5 each). In
  lockstep the samples equal one device's; continuous batching (whose schedule depends
  on the shards' slots) gives each token the log-prob an uncached forward pass over its
  own prompt gives it."""
  out = on_8_devices("""
    import jax, numpy as np
    from flax import nnx
    from isojax.models import sharding
    from isojax.models.transformer import ModelConfig, Transformer
    from isojax.rl import update
    from isojax.sampling import sampler
    cfg = ModelConfig(vocab_size=24, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=48, qkv_bias=True)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, 24, size=(8, 5)).astype(np.int32)
    mask = np.ones_like(prompts, bool); mask[::3, :2] = False
    sizes = (1, 4, 3, 2, 4, 1, 2, 3)
    group_B = sampler.group_index(sizes, 4, shards=4)
    mesh = sharding.make_mesh({"data": 4, "fsdp": 1, "tensor": 2})
    placed = jax.device_put(params, sharding.state_shardings(params, mesh))
    for slots in (0, 4):
      spec = sampler.SampleSpec(n=4, max_new_tokens=6, temperature=1.0, stop_ids=(2,),
                                pad_id=0, num_slots=slots)
      with jax.set_mesh(mesh):
        batch = sharding.shard_batch((prompts, mask), mesh)
        out = sampler.sample(graphdef, placed, *batch, jax.random.key(4), spec,
                             jax.device_put(group_B, sharding.batch_sharding(mesh, 1)))
      out = jax.tree.map(np.asarray, out)
      if not slots:
        single = sampler.sample(graphdef, params, prompts, mask, jax.random.key(4), spec,
                                group_B)
        np.testing.assert_array_equal(out.tokens, np.asarray(single.tokens))
        np.testing.assert_allclose(out.logprobs, np.asarray(single.logprobs), atol=1e-5)
      seq = np.concatenate([prompts[group_B], out.tokens], axis=1)
      seq_mask = np.concatenate([mask[group_B], out.mask], axis=1)
      scores = np.asarray(update.score(graphdef, params, seq, seq_mask, prompt_len=5,
                                       temperature=1.0))
      np.testing.assert_allclose(scores[out.mask], out.logprobs[out.mask], atol=1e-4)
    print("ok")
  """)
  assert out.strip().endswith("ok")
