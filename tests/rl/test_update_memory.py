"""Chunked log-probs and micro-batched updates: same numbers as one pass, less memory.

The references are the unchunked, unsplit computations (and NumPy over the model's
full logits); the memory test reads XLA's own buffer assignment of the compiled step.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import logprobs, losses, micro_batches, update

G, N, P, T = 4, 4, 3, 7      # groups, rollouts per group, prompt and response slots
B = G * N


def _model(vocab=37, width=16):
  cfg = ModelConfig(vocab_size=vocab, num_layers=1, embed_dim=width, num_heads=2,
                    num_kv_heads=1, head_dim=8, mlp_dim=32)
  return Transformer(cfg, rngs=nnx.Rngs(0))


def _sequences(rng, b=B, vocab=37):
  """Left-padded prompts and responses of different lengths (some empty)."""
  tokens_BS = rng.integers(1, vocab, size=(b, P + T)).astype(np.int32)
  mask_BS = np.ones((b, P + T), bool)
  mask_BS[::3, 0] = False                                   # left padding
  lengths_B = rng.integers(0, T + 1, size=b)
  mask_BS[:, P:] = np.arange(T)[None] < lengths_B[:, None]
  return tokens_BS, mask_BS


def _settings(**kw):
  base = dict(group_size=N, prompt_len=P, temperature=0.7, policy_loss="ppo_clip",
              clip_eps=0.2, clip_eps_high=0.28, cispo_eps_max=4.0, aggregation="token_mean",
              constant_normalizer=float(T), kl_coef=0.1, kl_form="k3", entropy_coef=0.01,
              tis_threshold=1.1, num_minibatches=2, num_epochs=1)
  return update.UpdateSettings(**{**base, **kw})


def _batch(graphdef, params, seed=0):
  rng = np.random.default_rng(seed)
  tokens_BS, mask_BS = _sequences(rng)
  logp_BT = update.score(graphdef, params, tokens_BS, mask_BS, prompt_len=P, temperature=0.7)
  noise = lambda: jnp.asarray(rng.normal(0, 0.3, (B, T)), jnp.float32)
  keep_pg = np.ones(B, bool)
  keep_pg[N:2 * N] = False                                  # one zero-variance group
  return update.TrainBatch(
      tokens=jnp.asarray(tokens_BS), mask=jnp.asarray(mask_BS),
      response_mask=jnp.asarray(mask_BS[:, P:]), sampler_logp=logp_BT + noise(),
      old_logp=logp_BT + noise(), ref_logp=logp_BT + noise(),
      advantages=jnp.asarray(rng.normal(size=B), jnp.float32),
      keep_pg=jnp.asarray(keep_pg), keep_reg=jnp.asarray(np.roll(keep_pg, N)),
      shuffle_rng=jax.random.key(1))


def _close(a, b, rtol=1e-5, atol=1e-6):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------------
# Chunked log-probs and entropy.
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 3])  # 3 pads T = 7 to 9
def test_chunked_logp_and_entropy_equal_unchunked_in_value_and_gradient(chunk_size):
  model = _model()
  graphdef, params = nnx.split(model)
  tokens_BS, mask_BS = _sequences(np.random.default_rng(0))
  weights = jax.random.normal(jax.random.key(2), (2, B, T))

  def run(params, chunk):
    logp_BT, entropy_BT = logprobs.response_logp(
        nnx.merge(graphdef, params), tokens_BS, mask_BS, prompt_len=P, temperature=0.7,
        chunk_size=chunk, need_entropy=True)
    return jnp.sum(weights[0] * logp_BT) + jnp.sum(weights[1] * entropy_BT), (logp_BT,
                                                                           entropy_BT)

  grad = jax.jit(jax.grad(run, has_aux=True), static_argnums=1)
  want_grads, (want_logp, want_entropy) = grad(params, 0)
  got_grads, (got_logp, got_entropy) = grad(params, chunk_size)
  _close((got_logp, got_entropy), (want_logp, want_entropy))
  _close(got_grads, want_grads, rtol=1e-4, atol=1e-6)
  # Independent reference: NumPy softmax of the full forward's tempered logits.
  logits = np.asarray(model(tokens_BS, mask_BS), np.float64)[:, P - 1:-1] / 0.7
  logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  np.testing.assert_allclose(
      np.asarray(got_logp),
      np.take_along_axis(logp_all, tokens_BS[:, P:, None], -1)[..., 0], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(got_entropy),
                             -(np.exp(logp_all) * logp_all).sum(-1), rtol=1e-5, atol=1e-5)


def test_entropy_is_skipped_unless_asked():
  model = _model()
  tokens_BS, mask_BS = _sequences(np.random.default_rng(0))
  for chunk in (0, 3):
    _, entropy = logprobs.response_logp(model, tokens_BS, mask_BS, prompt_len=P,
                                        temperature=1.0, chunk_size=chunk)
    assert entropy is None


@pytest.mark.parametrize("micro_batch_size,chunk_size,buckets",
                         [(0, 3, 0), (2, 0, 0), (4, 3, 0), (16, 7, 0), (2, 3, 2), (0, 0, 3)])
def test_score_micro_batched_equals_one_pass(micro_batch_size, chunk_size, buckets):
  """Micro-batches, chunks and the cut to the responses (rows back in their order)."""
  graphdef, params = nnx.split(_model())
  tokens_BS, mask_BS = _sequences(np.random.default_rng(1))
  want = update.score(graphdef, params, tokens_BS, mask_BS, prompt_len=P, temperature=0.7)
  got = update.score(graphdef, params, tokens_BS, mask_BS, prompt_len=P, temperature=0.7,
                     micro_batch_size=micro_batch_size, chunk_size=chunk_size,
                     length_buckets=buckets)
  assert got.shape == (B, T)
  # A cut leaves 0 past a micro-batch's longest response, where no loss term reads.
  response_BT = mask_BS[:, P:]
  _close(np.where(response_BT, got, 0.0), np.where(response_BT, want, 0.0))
  if not buckets:
    _close(got, want)
  elif micro_batch_size:  # some micro-batch of short responses was cut
    assert (np.asarray(got)[~response_BT] == 0).any()


# --------------------------------------------------------------------------------
# Gradient accumulation.
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(losses.AGGREGATIONS))
def test_aggregation_weights_reproduce_aggregate(name):
  rng = np.random.default_rng(0)
  x_BT = jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
  mask_BT = jnp.asarray(rng.random((B, T)) < 0.6).at[:N].set(False)  # an empty group
  w_BT = losses.aggregation_weights(name, mask_BT, group_size=N, constant_normalizer=9.0)
  want = losses.aggregate(name, x_BT, mask_BT, group_size=N, constant_normalizer=9.0)
  np.testing.assert_allclose(float(jnp.sum(w_BT * x_BT)), float(want), rtol=1e-5)
  assert not np.any(np.asarray(w_BT)[~np.asarray(mask_BT)])


@pytest.mark.parametrize("aggregation,policy_loss", [("token_mean", "ppo_clip")] + [
    pytest.param(*case, marks=pytest.mark.slow("each case compiles three train steps"))
    for case in (("sequence_mean", "gspo"), ("prompt_mean", "cispo"), ("constant", "dapo"))])
def test_micro_batched_train_step_equals_one_pass(aggregation, policy_loss):
  """k micro-batches (which split groups) give the parameters and stats of one pass."""
  graphdef, params = nnx.split(_model())
  batch = _batch(graphdef, params)
  longest_G = np.asarray(batch.response_mask).sum(1).reshape(G, N).max(1)
  assert (np.sort(longest_G)[1:] > 4).all()  # so any two groups (a minibatch) need the 7
  tx = optax.sgd(0.5)  # not Adam: its normalisation would hide a wrong gradient scale
  results = []
  # One pass; 4 micro-batches per minibatch; the same cut to their responses
  # (rl.length_buckets: slots 2, 4 or 7), and one micro-batch cut to its longest. Every
  # minibatch here holds a response of 6 or 7 tokens, so the one-micro-batch path takes
  # the 7 of any bucket list: one halving (4, 7) runs it as three (1, 2, 4, 7) would,
  # with half the branches to compile.
  for micro_batch_size, chunk_size, buckets in [(0, 0, 0), (2, 3, 0), (2, 3, 2), (0, 0, 1)]:
    settings = _settings(aggregation=aggregation, policy_loss=policy_loss,
                         micro_batch_size=micro_batch_size, logprob_chunk_size=chunk_size,
                         length_buckets=buckets)
    own = jax.tree.map(jnp.copy, params)  # train_step donates its parameters
    results.append(update.train_step(graphdef, own, tx.init(own), batch, tx=tx,
                                     settings=settings))
  (want_params, _, want_stats) = results[0]
  assert {"entropy", "kl", "loss", "grad_norm", "ratio_max"} <= set(want_stats)
  moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(want_params), jax.tree.leaves(params)))
  assert moved > 1e-3
  for got_params, _, got_stats in results[1:]:
    assert set(got_stats) == set(want_stats)
    _close(got_stats, want_stats, rtol=1e-5, atol=1e-6)
    _close(got_params, want_params, rtol=1e-5, atol=1e-6)


def test_length_order_gives_each_micro_batch_a_block_of_similar_lengths():
  """Split by `split_micro`, the order gives micro-batch j the j-th block of rows by
  response length; with this batch most blocks fit a shorter bucket than T."""
  graphdef, params = nnx.split(_model())
  batch = _batch(graphdef, params)
  lengths_B = np.asarray(batch.mask)[:, P:].sum(1)
  k = 8
  order = np.asarray(micro_batches.length_order(batch.mask, k, P))
  assert sorted(order.tolist()) == list(range(B))
  micro_lengths = np.asarray(micro_batches.split_micro(jnp.asarray(lengths_B[order]), k))
  np.testing.assert_array_equal(micro_lengths.reshape(-1), np.sort(lengths_B))
  assert micro_batches.response_buckets(T, 2) == (2, 4, 7)
  assert micro_batches.response_buckets(128, 3) == (16, 32, 64, 128)
  buckets = np.searchsorted(micro_batches.response_buckets(T, 2), micro_lengths.max(1))
  assert (buckets < 2).sum() >= k // 2   # the cut path is what the step test compares


def test_skipped_entropy_and_kl_are_absent_and_do_not_change_the_update():
  graphdef, params = nnx.split(_model())
  batch = _batch(graphdef, params)
  tx = optax.sgd(0.5)
  out = {}
  for log in (True, False):
    settings = _settings(kl_coef=0.0, entropy_coef=0.0, log_entropy=log, log_kl=log,
                         micro_batch_size=4)
    own = jax.tree.map(jnp.copy, params)
    out[log] = update.train_step(graphdef, own, tx.init(own), batch, tx=tx, settings=settings)
  assert {"entropy", "kl"} <= set(out[True][2])
  assert not {"entropy", "kl"} & set(out[False][2])
  _close(out[False][0], out[True][0])
  # A loss term is computed whether or not it is logged.
  settings = _settings(log_entropy=False, log_kl=False)
  assert settings.need_entropy and settings.need_kl


def test_invalid_micro_batch_size_is_a_clear_error():
  graphdef, params = nnx.split(_model())
  batch = _batch(graphdef, params)
  tx = optax.sgd(0.5)
  with pytest.raises(ValueError, match=r"rl.micro_batch_size=3 must divide the minibatch of "
                                       r"8 rollouts \(.*rl.num_minibatches=2\)"):
    update.train_step(graphdef, params, tx.init(params), batch, tx=tx,
                      settings=_settings(micro_batch_size=3))
  with pytest.raises(ValueError, match="rl.micro_batch_size=-1: expected >= 0"):
    update.train_step(graphdef, params, tx.init(params), batch, tx=tx,
                      settings=_settings(micro_batch_size=-1))
  with pytest.raises(ValueError, match="rl.micro_batch_size=5 must divide the rollout batch "
                                       "of 16 rollouts"):
    update.score(graphdef, params, batch.tokens, batch.mask, prompt_len=P, temperature=1.0,
                 micro_batch_size=5)


@pytest.mark.slow("compiles the train step at four micro-batch sizes")
def test_compiled_step_memory_does_not_grow_with_micro_batches():
  """XLA's temporary buffers shrink with the micro-batch and stay far below [B, T, V]."""
  vocab, b, t = 4096, 64, 64
  graphdef, params = nnx.split(_model(vocab=vocab))
  spec = lambda shape, dtype=jnp.float32: jax.ShapeDtypeStruct(shape, dtype)
  batch = update.TrainBatch(
      tokens=spec((b, P + t), jnp.int32), mask=spec((b, P + t), bool),
      response_mask=spec((b, t), bool), sampler_logp=spec((b, t)), old_logp=spec((b, t)),
      ref_logp=spec((b, t)), advantages=spec((b,)), keep_pg=spec((b,), bool),
      keep_reg=spec((b,), bool), shuffle_rng=jax.eval_shape(lambda: jax.random.key(0)))
  tx = optax.sgd(0.1)
  settings = _settings(num_minibatches=1, logprob_chunk_size=16)

  def temp_bytes(micro_batch_size):
    compiled = update.train_step.lower(
        graphdef, params, tx.init(params), batch, tx=tx,
        settings=dataclasses.replace(settings, micro_batch_size=micro_batch_size)).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  whole, quarter, sixteenth = temp_bytes(b), temp_bytes(b // 4), temp_bytes(b // 16)
  logits_bytes = b * t * vocab * 4
  print(f"temp bytes: micro {b}: {whole}, {b // 4}: {quarter}, {b // 16}: {sixteenth}; "
        f"[B, T, V] logits: {logits_bytes}")
  assert sixteenth <= quarter <= whole
  assert sixteenth < logits_bytes / 8


# --------------------------------------------------------------------------------
# The old log-probs of a synchronous one-epoch, one-minibatch step.
# --------------------------------------------------------------------------------


@pytest.mark.parametrize("policy_loss,micro_batch_size", [("ppo_clip", 0), ("cispo", 4)])
def test_old_logp_in_pass_equals_a_separate_scoring_pass(policy_loss, micro_batch_size):
  """The update computing its old log-probs in its own pass (no `score` call) makes the
  same update, and the same TIS statistics, as one given them by a separate pass."""
  graphdef, params = nnx.split(_model())
  batch = _batch(graphdef, params)
  separate = batch.replace(old_logp=update.score(graphdef, params, batch.tokens, batch.mask,
                                                 prompt_len=P, temperature=0.7))
  tx = optax.adam(1e-2)
  settings = _settings(policy_loss=policy_loss, num_minibatches=1,
                       micro_batch_size=micro_batch_size)
  copy = lambda tree: jax.tree.map(jnp.copy, tree)
  want_params, _, want = update.train_step(graphdef, copy(params), tx.init(params), separate,
                                           tx=tx, settings=settings)
  got_params, _, got = update.train_step(
      graphdef, copy(params), tx.init(params), batch.replace(old_logp=None), tx=tx,
      settings=dataclasses.replace(settings, old_logp_in_pass=True))
  _close(got_params, want_params, rtol=1e-4, atol=1e-6)
  assert float(got["ratio_max"]) == float(got["ratio_min"]) == 1.0
  for key in ("loss", "grad_norm", "tis/mean_abs_logp_diff", "tis/mean_weight", "entropy"):
    np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-4, atol=1e-6)


def test_old_logp_is_known_only_for_one_synchronous_update():
  from isojax.rl import settings as rl_settings  # pylint: disable=g-import-not-at-top
  assert rl_settings.RLSettings().old_logp_known
  for field, value in (("num_epochs", 2), ("num_minibatches", 2), ("max_staleness", 1)):
    changed = dataclasses.replace(rl_settings.RLSettings(), **{field: value})
    assert not changed.old_logp_known, field
