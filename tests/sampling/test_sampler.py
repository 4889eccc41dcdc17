"""The cached sampler against an uncached forward pass, and prompt-cache sharing."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import update
from isojax.sampling import decode, sampler

EOS, PAD = 2, 0


def _model(**overrides):
  cfg = dict(vocab_size=23, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
             head_dim=8, mlp_dim=48, qk_norm=True, qkv_bias=True)
  cfg.update(overrides)
  model = Transformer(ModelConfig(**cfg), rngs=nnx.Rngs(3))
  # Larger weights than the init so logits are far from uniform and argmax is stable.
  state = nnx.state(model)
  state = jax.tree.map(lambda x: x * 8 if x.ndim == 2 else x, state)
  nnx.update(model, state)
  return model


def _prompts():
  """Two left-padded prompts of different lengths."""
  tokens = np.array([[PAD, PAD, 5, 6, 7], [3, 4, 8, 9, 10]], np.int32)
  return tokens, tokens != PAD


def _uncached_greedy(model, tokens, mask, steps, stop=None):
  """Argmax decoding that reruns the whole sequence for every new token, row by row,
  each time as one left-padded buffer of the final width (one compiled forward)."""
  width = tokens.shape[1] + steps
  last_logits = jax.jit(lambda ids, keep: model(ids, keep)[:, -1])
  rows = []
  for row in range(tokens.shape[0]):
    seq, new = list(tokens[row][mask[row]]), []
    while len(new) < steps and (not new or new[-1] != stop):
      keep = np.arange(width) >= width - len(seq)
      ids = np.zeros(width, np.int32)
      ids[keep] = seq
      new.append(int(np.argmax(last_logits(ids[None], keep[None])[0])))
      seq.append(new[-1])
    rows.append(new)
  return rows


def test_greedy_cached_equals_uncached_argmax():
  model = _model()
  tokens, mask = _prompts()
  graphdef, state = nnx.split(model)
  out = sampler.sample(graphdef, state, tokens, mask, jax.random.key(0),
      sampler.SampleSpec(n=1, max_new_tokens=6, temperature=0.0, stop_ids=(EOS,), pad_id=PAD))
  expected = _uncached_greedy(model, tokens, mask, 6, stop=EOS)
  for row in range(tokens.shape[0]):
    got = np.asarray(out.tokens[row])[np.asarray(out.mask[row])]
    assert got.tolist() == expected[row]


def _while_carries(jaxpr):
  """Avals carried by every while loop in a (closed) jaxpr, nested ones included."""
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "while":
      yield from eqn.params["body_jaxpr"].in_avals
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if hasattr(sub, "eqns") or hasattr(sub, "jaxpr"):
          yield from _while_carries(getattr(sub, "jaxpr", sub))


def test_sampling_dtype_runs_activations_and_caches_in_bfloat16():
  """`dtype=bfloat16` on a float32 model: every decode loop (lockstep and continuous
  batching) carries its layer caches in bfloat16 (float32 without it), and the greedy
  tokens are those of uncached argmax decoding by a model built in bfloat16 from the
  same parameters."""
  model = _model()
  tokens, mask = _prompts()
  graphdef, state = nnx.split(model)
  kw = dict(n=2, max_new_tokens=6, temperature=0.0, stop_ids=(), pad_id=PAD)
  cfg = model.cfg
  for slots in (0, 3):
    rows = slots or 4
    cache_shapes = {(rows, cfg.num_kv_heads, cfg.head_dim, 6),
                    (rows, cfg.num_kv_heads, 6, cfg.head_dim)}
    for dtype, expected in ((None, jnp.float32), ("bfloat16", jnp.bfloat16)):
      traced = jax.make_jaxpr(lambda st, p, m, k, dtype=dtype, slots=slots: sampler.sample(
          graphdef, st, p, m, k, sampler.SampleSpec(dtype=dtype, num_slots=slots, **kw)))(
              state, tokens, mask, jax.random.key(0))
      caches = [a for a in _while_carries(traced.jaxpr) if a.shape in cache_shapes]
      assert len(caches) >= 2 * cfg.num_layers, (slots, dtype)
      assert {a.dtype for a in caches} == {jnp.dtype(expected)}, (slots, dtype)
  out = sampler.sample(graphdef, state, tokens, mask, jax.random.key(0),
                       sampler.SampleSpec(dtype="bfloat16", **kw))
  reference = Transformer(dataclasses.replace(cfg, dtype="bfloat16"), rngs=nnx.Rngs(0))
  nnx.update(reference, state)
  np.testing.assert_array_equal(
      np.asarray(out.tokens), np.repeat(_uncached_greedy(reference, tokens, mask, 6), 2, 0))
  assert model.with_dtype("float32") is model


def test_stops_at_eos_and_pads_after():
  """Declare row 0's first greedy token to be EOS: row 0 stops there, row 1 goes on."""
  model = _model()
  tokens, mask = _prompts()
  graphdef, state = nnx.split(model)
  free = sampler.sample(graphdef, state, tokens, mask, jax.random.key(0),
      sampler.SampleSpec(n=1, max_new_tokens=5, temperature=0.0, stop_ids=(), pad_id=PAD))
  eos = int(free.tokens[0, 0])
  assert eos not in np.asarray(free.tokens[1]).tolist(), "pick prompts where row 1 differs"
  out = sampler.sample(graphdef, state, tokens, mask, jax.random.key(0),
      sampler.SampleSpec(n=1, max_new_tokens=5, temperature=0.0, stop_ids=(eos,), pad_id=PAD))
  np.testing.assert_array_equal(np.asarray(out.mask), [[1, 0, 0, 0, 0], [1, 1, 1, 1, 1]])
  np.testing.assert_array_equal(np.asarray(out.tokens[0]), [eos, PAD, PAD, PAD, PAD])
  np.testing.assert_array_equal(np.asarray(out.tokens[1]), np.asarray(free.tokens[1]))
  np.testing.assert_array_equal(np.asarray(out.finished), [True, False])


def test_any_of_several_stop_ids_ends_a_rollout():
  """Two stop ids (Llama 3 / Qwen Instruct list several): each row stops at whichever
  of them comes first in its unconstrained greedy continuation; the rest run on."""
  model = _model()
  tokens, mask = _prompts()
  graphdef, state = nnx.split(model)
  free = np.asarray(sampler.sample(graphdef, state, tokens, mask, jax.random.key(0),
                                   sampler.SampleSpec(n=1, max_new_tokens=6, temperature=0.0,
                                                      stop_ids=(), pad_id=PAD)).tokens)
  stop_a, stop_b = int(free[0, 1]), int(free[1, 2])  # row 0's 2nd token, row 1's 3rd
  stops = (stop_a, stop_b)
  out = sampler.sample(graphdef, state, tokens, mask, jax.random.key(0),
      sampler.SampleSpec(n=1, max_new_tokens=6, temperature=0.0, stop_ids=stops, pad_id=PAD))
  for row in range(2):
    # Reference: the free greedy row cut after its first token in either stop id.
    first = next((t for t, tok in enumerate(free[row]) if tok in stops), None)
    length = 6 if first is None else first + 1
    got_mask = np.asarray(out.mask[row])
    assert got_mask.sum() == length and got_mask[:length].all()
    np.testing.assert_array_equal(np.asarray(out.tokens[row])[:length], free[row, :length])
    assert bool(out.finished[row]) == (first is not None)


@pytest.mark.parametrize("n, top_k, top_p", [(1, 0, 1.0), (3, 0, 1.0), (3, 5, 0.9)])
def test_sampler_logprobs_match_trainer_scores(n, top_k, top_p):
  """Log-probs the sampler reports equal the tempered log-softmax of a full forward (with
  top-k / top-p too: they restrict where samples land, not the policy's log-probs)."""
  model = _model()
  tokens, mask = _prompts()
  graphdef, state = nnx.split(model)
  out = sampler.sample(graphdef, state, tokens, mask, jax.random.key(1),
      sampler.SampleSpec(n=n, max_new_tokens=6, temperature=0.6, top_k=top_k, top_p=top_p,
                         stop_ids=(EOS,), pad_id=PAD))
  seq = np.concatenate([np.repeat(tokens, n, 0), np.asarray(out.tokens)], axis=1)
  seq_mask = np.concatenate([np.repeat(mask, n, 0), np.asarray(out.mask)], axis=1)
  scores = update.score(graphdef, state, seq, seq_mask, prompt_len=tokens.shape[1],
                        temperature=0.6)
  valid = np.asarray(out.mask)
  np.testing.assert_allclose(np.asarray(scores)[valid], np.asarray(out.logprobs)[valid],
                             atol=1e-4)


def test_shared_prompt_cache_equals_per_rollout_cache():
  """Decoding against one cache per group gives the logits of n separate copies."""
  model = _model(qk_norm=False)
  tokens, mask = _prompts()
  n, steps = 3, 4
  _, prefix = decode.prefill(model, jnp.asarray(tokens), jnp.asarray(mask))
  copied = jax.tree.map(lambda x: jnp.repeat(x, n, axis=0), prefix)  # one per rollout
  rng = np.random.default_rng(0)
  feed = rng.integers(3, 23, size=(steps, tokens.shape[0] * n))
  prompt_len = np.repeat(mask.sum(1), n)
  cache_shared = decode.init_cache(model, tokens.shape[0] * n, steps)
  cache_copied = decode.init_cache(model, tokens.shape[0] * n, steps)
  for t in range(steps):
    pos = jnp.asarray(prompt_len + t)
    shared, cache_shared = decode.decode_step(model, jnp.asarray(feed[t]),
                                              pos, t, prefix, cache_shared)
    separate, cache_copied = decode.decode_step(model, jnp.asarray(feed[t]),
                                                pos, t, copied, cache_copied)
    np.testing.assert_allclose(np.asarray(shared), np.asarray(separate), atol=1e-5, rtol=1e-5)
  # ... and both equal the uncached forward on the whole sequence.
  full = np.concatenate([np.repeat(tokens, n, 0), feed.T], axis=1)
  full_mask = np.concatenate([np.repeat(mask, n, 0), np.ones_like(feed.T, bool)], axis=1)
  np.testing.assert_allclose(np.asarray(model(full, full_mask))[:, -1], np.asarray(shared),
                             atol=1e-4, rtol=1e-4)


def _cache_sized_copies_in_loops(hlo_text: str, dims: tuple[int, ...]) -> list[str]:
  """Copy or transpose instructions (fused or not) in the bodies of the compiled
  program's while loops whose result has a layer cache's dims, in any order."""
  import re  # pylint: disable=g-import-not-at-top
  computations = dict(re.findall(r"^(?:ENTRY )?%(\S+) .*?\{\n(.*?)^\}", hlo_text, re.M | re.S))
  bodies = set(re.findall(r"body=%([\w.-]+)", hlo_text))
  assert bodies and bodies <= computations.keys()
  found = []
  for body in bodies:
    for m in re.finditer(r"%(\S+) = \w+\[([\d,]+)\]\S* (\w[\w-]*)\(", computations[body]):
      name, op = m.group(1), m.group(3)
      shape = tuple(int(d) for d in m.group(2).split(","))
      copying = op in ("copy", "transpose") or (op == "fusion" and re.search(
          r"copy|transpose", name))
      if copying and sorted(shape) == sorted(dims):
        found.append(m.group(0))
  return found


def test_decode_loop_neither_copies_nor_transposes_a_layers_cache():
  """Each decode step reads every layer's cache where it lies: the compiled sampler
  (lockstep and continuous batching) holds no copy or transpose of an array with a layer
  cache's dims [B, K, H, T]. The scanned decode with [L, B, T, K, H] caches had two such
  copies per layer per step on XLA:CPU (37% of a step in a profile)."""
  model = _model(num_layers=3, head_dim=16)
  graphdef, state = nnx.split(model)
  g, n, t = 3, 4, 7   # B = 12 rows, K = 2, H = 16, T = 7: no other array has these dims
  tokens = np.arange(1, 1 + g * 5, dtype=np.int32).reshape(g, 5) % 20 + 1
  for slots in (0, 6):
    compiled = jax.jit(lambda s, slots=slots: sampler.sample(
        graphdef, s, tokens, tokens > 0, jax.random.key(0),
            sampler.SampleSpec(n=n, max_new_tokens=t, temperature=1.0, stop_ids=(EOS,), pad_id=PAD,
                               num_slots=slots))).lower(state).compile()
    rows = slots or g * n
    assert _cache_sized_copies_in_loops(compiled.as_text(), (rows, 2, 16, t)) == [], slots
