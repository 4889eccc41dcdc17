"""The scanned decoder: rematerialisation, depth-independent tracing, bf16 compute."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from isojax.models import lm_head
from isojax.models import rope as rope_lib
from isojax.models.settings import REMAT_POLICIES, attention_implementation
from isojax.models.transformer import ModelConfig, Transformer

CFG = dict(vocab_size=31, embed_dim=32, num_heads=4, num_kv_heads=2, head_dim=8, mlp_dim=48,
           qkv_bias=True)


def _loss_and_grads(cfg):
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 31, (2, 9)))
  mask = jnp.ones_like(tokens, bool).at[1, :3].set(False)

  def loss(p):
    logits = nnx.merge(graphdef, p)(tokens, mask)
    return jnp.sum(jax.nn.log_softmax(logits)[..., 0] * mask)
  return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize("policy", ["full"] + [
    pytest.param(p, marks=pytest.mark.slow("one compiled gradient per policy"))
    for p in ("dots_saveable", "nothing_saveable")])
def test_remat_policies_leave_gradients_unchanged(policy):
  loss, grads = _loss_and_grads(ModelConfig(num_layers=3, **CFG))
  loss_r, grads_r = _loss_and_grads(ModelConfig(num_layers=3, remat=policy, **CFG))
  np.testing.assert_allclose(loss_r, loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_r), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def _rematerialised_equations(policy):
  """How many equations the backward pass recomputes (the scan body's remat)."""
  cfg = ModelConfig(num_layers=2, remat=policy, **CFG)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  tokens = jnp.zeros((1, 4), jnp.int32)
  jaxpr = jax.make_jaxpr(jax.grad(lambda p: nnx.merge(graphdef, p)(
      tokens, tokens >= 0).sum()))(params)
  return str(jaxpr).count("remat") + str(jaxpr).count("checkpoint")


def test_remat_actually_inserts_checkpoints():
  assert _rematerialised_equations("none") == 0
  assert _rematerialised_equations("full") > 0


def test_traced_program_does_not_grow_with_depth():
  """Layers are one scanned block: the jaxpr is the same size for 2 and 12 layers."""
  sizes = []
  for depth in (2, 12):
    cfg = ModelConfig(num_layers=depth, **CFG)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
    jaxpr = jax.make_jaxpr(lambda p, t: nnx.merge(graphdef, p)(t, t >= 0))(
        params, jax.ShapeDtypeStruct((2, 8), jnp.int32))
    sizes.append(len(str(jaxpr).splitlines()))
  assert sizes[0] == sizes[1], sizes


def test_stacked_layers_equal_an_unrolled_loop():
  """The scan computes exactly layer(layer(...(embed))): checked by running each
  layer's slice of the stacked parameters by hand."""
  cfg = ModelConfig(num_layers=3, **CFG)
  model = Transformer(cfg, rngs=nnx.Rngs(1))
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 31, (2, 7)))
  mask = jnp.ones_like(tokens, bool)
  graphdef, stacked = nnx.split(model.layers)
  positions = jnp.broadcast_to(jnp.arange(7), (2, 7))
  causal = jnp.tril(jnp.ones((7, 7), bool))[None]
  x = model.embed_tokens(tokens)
  for i in range(3):
    block = nnx.merge(graphdef, jax.tree.map(lambda v: v[i], stacked))  # pylint: disable=cell-var-from-loop
    rope = rope_lib.rope_tables(positions, rope_lib.rope_inverse_frequencies(
        cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), num_positions=7)
    x, _ = block(x, rope, lambda q, k, v: (block.attn.attend(q, k, v, causal), None))  # pylint: disable=cell-var-from-loop
  np.testing.assert_allclose(model.hidden_states(tokens, mask), x, atol=1e-6)


def test_bfloat16_compute_keeps_float32_parameters():
  """dtype=bfloat16: float32 master weights, bf16 matmuls, close to float32 logits."""
  cfg32 = ModelConfig(num_layers=2, **CFG)
  cfg16 = ModelConfig(num_layers=2, dtype="bfloat16", **CFG)
  m32, m16 = Transformer(cfg32, rngs=nnx.Rngs(0)), Transformer(cfg16, rngs=nnx.Rngs(0))
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(m16, nnx.Param)))
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 31, (2, 6)))
  mask = jnp.ones_like(tokens, bool)
  h16 = m16.hidden_states(tokens, mask)
  assert h16.dtype == jnp.bfloat16
  np.testing.assert_allclose(m16(tokens, mask), m32(tokens, mask), atol=5e-2)


def test_unknown_remat_policy_is_rejected():
  with pytest.raises(ValueError, match="model.remat='dots'.*dots_saveable"):
    ModelConfig(num_layers=1, remat="dots", **CFG)
  assert "dots_saveable" in REMAT_POLICIES


def test_chunked_attention_equals_full_attention_with_gradients():
  """attention_chunk = 4 or 5 over 12 positions: same loss and gradients as one block."""
  tokens = jnp.asarray(np.random.default_rng(3).integers(0, 31, (2, 12)))
  mask = jnp.ones_like(tokens, bool).at[0, :5].set(False)  # left padding

  def loss_and_grads(cfg):
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    return jax.value_and_grad(lambda p: jnp.sum(
        jax.nn.log_softmax(nnx.merge(graphdef, p)(tokens, mask))[..., 3] * mask))(params)
  loss, grads = loss_and_grads(ModelConfig(num_layers=2, **CFG))
  loss_c, grads_c = loss_and_grads(ModelConfig(num_layers=2, attention_chunk=4, **CFG))
  np.testing.assert_allclose(loss_c, loss, rtol=1e-6)
  for a, b in zip(jax.tree.leaves(grads_c), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)
  loss_5, grads_5 = loss_and_grads(ModelConfig(num_layers=2, attention_chunk=5, **CFG))
  np.testing.assert_allclose(loss_5, loss, rtol=1e-6)  # 12 = 5 + 5 + 2 (padded block)
  for a, b in zip(jax.tree.leaves(grads_5), jax.tree.leaves(grads)):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=1e-5)


def _head_product(model, h):
  """The LM head's dot_general in the traced `model.logits(h)`."""
  jaxpr = jax.make_jaxpr(model.logits)(h)
  (head,) = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"
             and e.outvars[0].aval.shape[-1] == CFG["vocab_size"]]
  return head


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("fp32_head", [True, False])
def test_float32_lm_head_multiplies_at_highest_precision(tied, fp32_head):
  """An f32 dot at the default precision is one bfloat16 pass on TPU and TF32 on GPUs
  (CPUs ignore precision, so this reads the traced program): with `fp32_lm_head` and
  float32 master weights, the head multiplies float32 operands at HIGHEST, also for
  bfloat16 activations; without it, bfloat16 operands at the default precision."""
  cfg = ModelConfig(num_layers=1, dtype="bfloat16", fp32_lm_head=fp32_head,
                    tie_embeddings=tied, **CFG)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  head = _head_product(model, jnp.ones((2, 3, CFG["embed_dim"]), jnp.bfloat16))
  want_dtype = jnp.float32 if fp32_head else jnp.bfloat16
  assert [v.aval.dtype for v in head.invars] == [want_dtype, want_dtype]
  highest = jax.lax.Precision.HIGHEST
  assert head.params["precision"] == ((highest, highest) if fp32_head else None)
  assert head.outvars[0].aval.dtype == want_dtype


@pytest.mark.parametrize("tied", [False, True])
def test_float32_lm_head_on_bfloat16_weights_accumulates_exact_products(tied):
  """bfloat16 sampling weights and activations: the head takes them as they are and
  accumulates in float32, which equals the float64 product of the same bfloat16 values
  to float32 summation error (every product of two bfloat16 values is exact in f32)."""
  cfg = ModelConfig(num_layers=1, dtype="bfloat16", tie_embeddings=tied, **CFG)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  nnx.update(model, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model, nnx.Param)))
  h = jnp.asarray(np.random.default_rng(3).normal(size=(2, 3, CFG["embed_dim"])), jnp.bfloat16)
  head = _head_product(model, h)
  assert [v.aval.dtype for v in head.invars] == [jnp.bfloat16, jnp.bfloat16]
  assert head.params["preferred_element_type"] == jnp.float32
  logits = model.logits(h)
  assert logits.dtype == jnp.float32
  rows = np.asarray(model.final_norm(h), np.float64)
  w = np.asarray(model.embed.embedding[...] if tied else model.lm_head.kernel[...].T, np.float64)
  np.testing.assert_allclose(np.asarray(logits, np.float64), rows @ w.T, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tied", [False, True])
def test_bf16x2_head_gives_float32_products_to_the_split_bound(tied):
  """bfloat16 activations on float32 weights (a bfloat16 model's training forward):
  the weights as bfloat16 hi + lo, two products accumulated in float32, equal the
  float64 product of the same activations and weights to 2^-16 of the terms' magnitudes;
  "highest" matches it to float32 summation error. The weight gradient is the float64
  one to bfloat16 rounding, as every bfloat16 layer's is."""
  rng = np.random.default_rng(4)
  h = jnp.asarray(rng.normal(size=(2, 3, CFG["embed_dim"])), jnp.bfloat16)
  logits, grads = {}, {}
  for precision in ("highest", "bf16x2"):
    cfg = ModelConfig(num_layers=1, dtype="bfloat16", tie_embeddings=tied,
                      lm_head_precision=precision, **CFG)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    logits[precision] = np.asarray(model.logits(h), np.float64)
    head = lambda m: m.embed.embedding if tied else m.lm_head.kernel
    loss = lambda m: jnp.sum(m.logits(h) ** 2 / 2)
    grads[precision] = np.asarray(head(nnx.grad(loss)(model))[...], np.float64)
  rows = np.asarray(model.final_norm(h), np.float64)
  w = np.asarray(model.embed.embedding[...] if tied else model.lm_head.kernel[...].T,
                 np.float64)
  exact = rows @ w.T
  scale = np.abs(rows) @ np.abs(w).T
  assert np.all(np.abs(logits["bf16x2"] - exact) <= 2.0 ** -16 * scale + 1e-7)
  assert np.all(np.abs(logits["highest"] - exact) <= 1e-6 * scale + 1e-7)
  assert not np.array_equal(logits["bf16x2"], np.asarray(
      rows.astype(np.float32) @ w.T.astype(jnp.bfloat16).astype(np.float32), np.float64))
  grad_exact = (exact.reshape(-1, exact.shape[-1]).T @ rows.reshape(-1, rows.shape[-1]))
  grad_exact = grad_exact if tied else grad_exact.T
  np.testing.assert_allclose(grads["highest"], grad_exact, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grads["bf16x2"], grad_exact, rtol=2 ** -7, atol=1e-3)


def test_auto_head_precision_is_bf16x2_on_gpus_only(monkeypatch):
  """"auto" is traced as "bf16x2" where the default backend is a GPU, "highest" on CPU
  and TPU; a setting named by hand is kept."""
  for backend, want in (("gpu", "bf16x2"), ("cpu", "highest"), ("tpu", "highest")):
    monkeypatch.setattr(jax, "default_backend", lambda b=backend: b)
    assert lm_head.head_precision("auto") == want
    assert lm_head.head_precision("highest") == "highest"
    assert lm_head.head_precision("bf16x2") == "bf16x2"


def test_an_unknown_head_precision_is_rejected_naming_the_field():
  with pytest.raises(ValueError, match=r"model\.lm_head_precision"):
    ModelConfig(num_layers=1, lm_head_precision="tf32", **CFG)


def test_rope_tables_are_cos_and_sin_of_position_times_frequency():
  """Rows gathered from the per-position table: NumPy's cos and sin of the same float32
  angles (position * inverse frequency), at positions up to the table's last."""
  inv_freq = rope_lib.rope_inverse_frequencies(64, 1e6, None)
  positions = jnp.asarray([[0, 1, 2, 4095], [17, 3000, 4095, 5]], jnp.int32)
  cos, sin = rope_lib.rope_tables(positions, inv_freq, num_positions=4096)
  angles = np.asarray(positions, np.float32)[..., None] * np.asarray(inv_freq)
  np.testing.assert_allclose(cos, np.cos(angles.astype(np.float64)), atol=2e-6)
  np.testing.assert_allclose(sin, np.sin(angles.astype(np.float64)), atol=2e-6)


def test_decode_computes_rotary_tables_once_per_step_not_per_layer():
  """The compiled sampler evaluates cos and sin as many times for 1 layer as for 3: the
  tables are shared by every layer, not fused into (and recomputed by) each rotation."""
  from isojax.sampling import sampler  # pylint: disable=g-import-not-at-top
  counts = []
  for depth in (1, 3):
    graphdef, state = nnx.split(Transformer(ModelConfig(num_layers=depth, **CFG),
                                            rngs=nnx.Rngs(0)))
    prompts = jnp.ones((2, 5), jnp.int32)
    spec = sampler.SampleSpec(n=2, max_new_tokens=4, temperature=1.0, stop_ids=(), pad_id=0)
    hlo = sampler.sample.lower(graphdef, state, prompts, prompts > 0, jax.random.key(0),
                               spec).compile().as_text()
    counts.append((hlo.count(" cosine("), hlo.count(" sine(")))
  assert counts[0] == counts[1], counts


def test_cudnn_attention_is_refused_where_it_cannot_run():
  """cuDNN's fused attention takes bfloat16 and needs a GPU: a float32 model is refused
  naming both fields, and a bfloat16 one on this backend when it traces, before any
  compilation."""
  with pytest.raises(ValueError, match=r"model\.attention_impl='cudnn' with "
                                       r"model\.dtype='float32'"):
    ModelConfig(num_layers=1, attention_impl="cudnn", **CFG)
  if jax.default_backend() == "gpu":
    pytest.skip("this machine has a GPU")
  model = Transformer(ModelConfig(num_layers=1, dtype="bfloat16", attention_impl="cudnn",
                                  **CFG), rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"needs a GPU; this backend is 'cpu'"):
    model(jnp.ones((1, 4), jnp.int32), jnp.ones((1, 4), bool))


def test_auto_attention_is_cudnn_only_where_it_runs():
  """`auto` picks cuDNN on a GPU of capability 8.0 or later under bfloat16 activations
  with head widths it takes, XLA's path everywhere else; a setting made by hand stays."""
  def impl(setting="auto", dtype="bfloat16", head_dim=64, backend="gpu", capability="9.0"):
    return attention_implementation(setting, dtype=dtype, head_dim=head_dim, backend=backend,
                                    capability=capability)
  assert impl() == "cudnn"
  assert impl(capability="8.0") == "cudnn"
  assert impl(capability="7.5") == "xla"
  assert impl(capability="") == "xla"
  assert impl(backend="cpu", capability="") == "xla"
  assert impl(backend="tpu", capability="") == "xla"
  assert impl(head_dim=12) == "xla"
  assert impl(head_dim=256) == "xla"
  assert impl(head_dim=128) == "cudnn"
  assert impl(dtype="float32") == "xla"
  assert impl("xla") == "xla"
  assert impl("cudnn", backend="cpu") == "cudnn"
  assert impl(capability="gfx90a") == "xla"  # not a CUDA capability


def test_auto_attention_on_this_cpu_is_xlas_program():
  """`auto` traces the same program as `xla` off a GPU: equal logits."""
  if jax.default_backend() == "gpu":
    pytest.skip("this machine has a GPU")
  tokens = jnp.asarray(np.random.default_rng(0).integers(1, CFG["vocab_size"], (2, 9)))
  mask = jnp.asarray(np.arange(9)[None, :] >= np.array([[0], [3]]))
  out = [np.asarray(Transformer(ModelConfig(num_layers=2, dtype="bfloat16",
                                            attention_impl=impl, **CFG),
                                rngs=nnx.Rngs(0))(tokens, mask), np.float32)
         for impl in ("auto", "xla")]
  np.testing.assert_array_equal(out[0], out[1])


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN runs on GPUs only")
def test_cudnn_attention_equals_xla_attention_with_left_padding():
  """On a GPU: cuDNN's fused attention gives XLA's logits and gradients on the real
  positions of left-padded rows (bfloat16 tolerances), and finite values everywhere."""
  shape = dict(CFG, num_heads=4, num_kv_heads=2, head_dim=64)
  models = {impl: Transformer(ModelConfig(num_layers=2, dtype="bfloat16", attention_impl=impl,
                                          **shape), rngs=nnx.Rngs(0))
            for impl in ("xla", "cudnn")}
  tokens = jnp.asarray(np.random.default_rng(1).integers(1, CFG["vocab_size"], (3, 24)))
  mask = jnp.asarray(np.arange(24)[None, :] >= np.array([[0], [5], [11]]))
  out, grads = {}, {}
  for impl, model in models.items():
    loss = lambda m: jnp.sum(jnp.where(mask[..., None], m(tokens, mask), 0.0) ** 2) / 100
    out[impl] = np.asarray(model(tokens, mask), np.float32)
    grads[impl] = jax.tree.leaves(nnx.state(nnx.grad(loss)(model), nnx.Param))
  real = np.asarray(mask)
  assert np.all(np.isfinite(out["cudnn"]))
  np.testing.assert_allclose(out["cudnn"][real], out["xla"][real], rtol=0.05, atol=0.05)
  for a, b in zip(grads["cudnn"], grads["xla"]):
    assert np.all(np.isfinite(np.asarray(a, np.float32)))
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32),
                               rtol=0.1, atol=0.02)
