"""Continuous batching against the lockstep sampler: greedy exactly, sampling in law."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from isojax.config import config_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.sampling import continuous, sampler

PAD = 0


def _split_model(scale: float):
  cfg = ModelConfig(vocab_size=23, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                    head_dim=8, mlp_dim=48, qk_norm=True, qkv_bias=True)
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  state = jax.tree.map(lambda x: x * scale if x.ndim == 2 else x, nnx.state(model))
  return nnx.graphdef(model), state


def _prompts(g: int, p: int = 6, seed: int = 0):
  """Left-padded random prompts of lengths 2..p."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(2, p + 1, g)
  mask = np.arange(p)[None] >= (p - lengths)[:, None]
  return np.where(mask, rng.integers(1, 23, (g, p)), PAD).astype(np.int32), mask


def _sample(graphdef, state, prompts, mask, key, **kw):
  return jax.tree.map(np.asarray, sampler.sample(graphdef, state, prompts, mask,
                                                 jax.random.key(key), sampler.SampleSpec(**kw)))


# Each slot setting with one or two of the stop sets ((4, 6): a first-token stop), so
# that every setting and every stop set appears without compiling all 15 pairs.
@pytest.mark.parametrize("num_slots, min_slots, stop_ids", [(5, 1, (4, 6))] + [
    pytest.param(*case, marks=pytest.mark.slow("one compiled sampler per setting"))
    for case in [(1, 0, (8,)), (5, 0, (3, 21)), (24, 0, (4, 6)), (24, 3, (8,)),
                 (24, 3, (4, 6)), (5, 1, (3, 21))]])
def test_greedy_equals_lockstep(num_slots, min_slots, stop_ids):
  """With min_slots, the slots halve (24 -> 12 -> 6 -> 3, 5 -> 2 -> 1) as the queue
  drains; each busy slot must carry its cache into its new row."""
  graphdef, state = _split_model(8.0)
  prompts, mask = _prompts(8)
  kw = dict(n=3, max_new_tokens=12, temperature=0.0, stop_ids=stop_ids, pad_id=PAD)
  lockstep = _sample(graphdef, state, prompts, mask, 0, **kw)
  continuous = _sample(graphdef, state, prompts, mask, 0, num_slots=num_slots,
                       min_slots=min_slots, **kw)
  lengths = lockstep.mask.sum(-1)
  assert len(set(lengths.tolist())) > 2  # the workload really is uneven
  for name in ("tokens", "mask", "finished"):
    np.testing.assert_array_equal(getattr(continuous, name), getattr(lockstep, name), name)
  np.testing.assert_allclose(continuous.logprobs, lockstep.logprobs, atol=2e-5)


def test_slots_are_refilled_until_every_rollout_is_done():
  """2 slots serve 16 rollouts: every one ends with a stop id or at max_new_tokens."""
  graphdef, state = _split_model(1.0)
  prompts, mask = _prompts(4)
  out = _sample(graphdef, state, prompts, mask, 1, n=4, max_new_tokens=7, temperature=1.0,
                stop_ids=(2, 3, 4, 5), pad_id=PAD, num_slots=2)
  lengths = out.mask.sum(-1)
  assert (lengths >= 1).all()
  last = out.tokens[np.arange(16), lengths - 1]
  stopped = np.isin(last, (2, 3, 4, 5))
  np.testing.assert_array_equal(out.finished, stopped)
  assert ((lengths == 7) | stopped).all()  # ran to its end or stopped: none cut short
  assert not np.isin(out.tokens[:, :-1] * out.mask[:, 1:], (2, 3, 4, 5)).any()
  assert (out.tokens[~out.mask] == PAD).all() and (out.logprobs[~out.mask] == 0).all()
  assert (out.logprobs[out.mask] < 0).all()


@pytest.mark.slow("thousands of sampled rollouts, two compiled samplers per case")
@pytest.mark.parametrize("min_slots", [0, 8])
def test_sampled_tokens_agree_in_distribution_with_lockstep(min_slots):
  """Per-position token frequencies of 2 x 400 rollouts: chi-square homogeneity tests."""
  graphdef, state = _split_model(2.0)
  prompts, mask = _prompts(2, seed=3)
  kw = dict(n=400, max_new_tokens=6, temperature=1.0, top_k=12, stop_ids=(2, 7), pad_id=PAD)
  lockstep = _sample(graphdef, state, prompts, mask, 5, **kw)
  continuous = _sample(graphdef, state, prompts, mask, 6, num_slots=64, min_slots=min_slots,
                       **kw)
  p_values = []
  for group in range(2):
    rows = slice(group * 400, (group + 1) * 400)
    for position in range(6):
      a, b = (np.bincount(o.tokens[rows, position], minlength=23)
              for o in (lockstep, continuous))
      seen = (a + b) > 0
      if seen.sum() > 1:
        p_values.append(stats.chi2_contingency(np.stack([a[seen], b[seen]]))[1])
  assert len(p_values) >= 10
  assert min(p_values) > 0.001 / len(p_values) * 10, sorted(p_values)[:3]  # Bonferroni-ish
  # And the two samplers really draw differently (same keys would give equal tokens).
  assert not np.array_equal(lockstep.tokens, continuous.tokens)
  # Length distribution (how often the stop ids end a rollout early) agrees too.
  lengths = [np.bincount(o.mask.sum(-1), minlength=7)[1:] for o in (lockstep, continuous)]
  assert stats.chi2_contingency(np.stack(lengths) + 1)[1] > 1e-3


@pytest.mark.parametrize("slots, min_slots, expected", [
    (64, 8, (64, 32, 16, 8)), (64, 10, (64, 32, 16)), (5, 1, (5, 2, 1)), (8, 0, (8,)),
    (8, 8, (8,)), (8, 9, (8,)), (1, 1, (1,))])
def test_slot_levels_halve_down_to_the_minimum(slots, min_slots, expected):
  assert continuous.slot_levels(slots, min_slots) == expected


def _slot_counts_of_loops(min_slots: int) -> list[int]:
  """The slot count of each decode loop in the traced sampler (from the [D, S] slot
  arrays of the while loops' carries)."""
  graphdef, state = _split_model(1.0)
  prompts, mask = _prompts(4)
  spec = sampler.SampleSpec(n=6, max_new_tokens=5, temperature=1.0, stop_ids=(2,), pad_id=PAD,
                            num_slots=16, min_slots=min_slots)
  traced = sampler.sample.trace(graphdef, state, jnp.asarray(prompts), jnp.asarray(mask),
                                jax.random.key(0), spec)
  loops = [e for e in traced.jaxpr.jaxpr.eqns if e.primitive.name == "while"]
  counts = []
  for loop in loops:
    carry = [v.aval for v in loop.outvars]
    counts.append(next(a.shape[1] for a in carry if a.dtype == jnp.int32 and a.ndim == 2))
  return counts


def test_each_slot_level_is_one_decode_loop():
  assert _slot_counts_of_loops(0) == [16]
  assert _slot_counts_of_loops(2) == [16, 8, 4, 2]


@pytest.mark.parametrize("field, value, match", [
    ("decode_slots_min", -1, "decode_slots_min=-1: expected an integer >= 0"),
    ("decode_slots_min", True, "decode_slots_min=True: expected an integer"),
    ("decode_slots_min", 4, "decode_slots_min=4 needs continuous batching"),
    ("decode_slots", -2, "decode_slots=-2: expected an integer >= 0")])
def test_config_rejects_bad_slot_fields(field, value, match):
  config = config_lib.base_config()
  config.num_steps = 1
  config.sampling[field] = value
  with pytest.raises(ValueError, match=f"sampling.{match}"):
    config_lib.resolve(config)
