"""Continuous batching against the lockstep sampler: greedy exactly, sampling in law."""

import jax
import numpy as np
import pytest
from flax import nnx
from scipy import stats

from isojax.models.transformer import ModelConfig, Transformer
from isojax.sampling import sampler

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
                                                 jax.random.key(key), **kw))


@pytest.mark.parametrize("stop_ids", [(8,), (3, 21), (4, 6)])  # (4, 6): a first-token stop
@pytest.mark.parametrize("num_slots", [1, 5, 24])
def test_greedy_equals_lockstep(stop_ids, num_slots):
  graphdef, state = _split_model(8.0)
  prompts, mask = _prompts(8)
  kw = dict(n=3, max_new_tokens=12, temperature=0.0, stop_ids=stop_ids, pad_id=PAD)
  lockstep = _sample(graphdef, state, prompts, mask, 0, **kw)
  continuous = _sample(graphdef, state, prompts, mask, 0, num_slots=num_slots, **kw)
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


def test_sampled_tokens_agree_in_distribution_with_lockstep():
  """Per-position token frequencies of 2 x 400 rollouts: chi-square homogeneity tests."""
  graphdef, state = _split_model(2.0)
  prompts, mask = _prompts(2, seed=3)
  kw = dict(n=400, max_new_tokens=6, temperature=1.0, top_k=12, stop_ids=(2, 7), pad_id=PAD)
  lockstep = _sample(graphdef, state, prompts, mask, 5, **kw)
  continuous = _sample(graphdef, state, prompts, mask, 6, num_slots=64, **kw)
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
