"""One Flax NNX decoder-only transformer for the Llama 3 / Qwen2.5 / Qwen3 family.

RMSNorm, rotary embeddings (`models/rope.py`, with Llama 3 scaling), grouped-query attention,
SwiGLU, optional qkv bias (Qwen2.5), optional per-head q/k RMSNorm (Qwen3), tied or
untied embeddings; optional low-rank adapters (LoRA) beside the attention and MLP
projections (`model.lora`). Every parameter carries logical axis names (`embed`, `heads`,
`kv_heads`, `mlp`, `vocab`, `head_dim`); `isojax.models.sharding` maps them to mesh axes.

The layers are one `Block` whose parameters are stacked on a leading `layers` axis.
Whole sequences run them by `lax.scan` (compile time independent of depth, `cfg.remat`
choosing what the backward pass recomputes); a decode step runs them as a Python loop
over per-layer blocks and per-layer caches. Three entry points share the one `Block`
code path (each passes it its own attention):
  `__call__`             uncached forward over whole sequences (training, tests);
  `decode.prefill`       forward over left-padded prompts, returning each layer's
                         keys/values;
  `decode.decode_step`   one new token per rollout attending to the *shared* prompt
                         cache of its group plus its own generated cache.
The decode-time caches and their attention live beside the sampler
(`isojax.sampling.decode`); this module is the model.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from isojax.models import lm_head as head_lib
from isojax.models import settings as settings_lib
from isojax.models import rope as rope_lib
from isojax.models import sharding


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  vocab_size: int
  num_layers: int
  embed_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  rope_theta: float = 10000.0
  rope_scaling: dict | None = None     # Llama 3: {"rope_type": "llama3", ...}
  rms_norm_eps: float = 1e-6
  qkv_bias: bool = False               # Qwen2.5
  qk_norm: bool = False                # Qwen3
  tie_embeddings: bool = False
  dtype: str = "float32"               # activation dtype; parameters are float32
  fp32_lm_head: bool = True            # logits computed in float32
  lm_head_precision: str = "auto"      # auto | highest | bf16x2 (`lm_head.head_matmul`)
  remat: str = "none"                  # none | full | a REMAT_POLICIES name
  attention_chunk: int = 0             # queries per attention block; 0: all at once
  attention_impl: str = "xla"          # xla | cudnn | auto (`attention_implementation`)
  lora: settings_lib.LoraSettings = settings_lib.LoraSettings()  # rank 0: no adapters

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    object.__setattr__(self, "lora", self.settings().lora)  # validated, and hashable
    for target in self.lora.targets if self.lora.enabled else ():
      width = min(self.projection_dims(target))
      if self.lora.rank > width:
        raise ValueError(f"model.lora.rank={self.lora.rank}: larger than {target}'s "
                         f"width {width} (a rank-{width} update is already full rank)")

  def settings(self) -> settings_lib.ModelSettings:
    """The run-time fields (`config.model`), validated."""
    return settings_lib.ModelSettings(dtype=self.dtype, fp32_lm_head=self.fp32_lm_head,
                                      lm_head_precision=self.lm_head_precision,
                                      remat=self.remat, attention_chunk=self.attention_chunk,
                                      attention_impl=self.attention_impl,
                                      lora=self.lora)

  def projection_dims(self, name: str) -> tuple[int, int]:
    """(in, out) of one of a block's projections (`settings.LORA_TARGETS`)."""
    d, f = self.embed_dim, self.mlp_dim
    heads, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    return {"q_proj": (d, heads), "k_proj": (d, kv), "v_proj": (d, kv), "o_proj": (heads, d),
            "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}[name]


# Logical axes of the residual stream [B, S, D]: rows over the data-parallel axes
# (FSDP gathers each layer's weights; activations are never split on `embed`).
ACTIVATION_AXES = ("batch", None, None)
def _param(init, names):
  return nnx.with_partitioning(init, names)


class LoRA(nnx.Module):
  """A projection's low-rank update: rows [N, in] -> rows @ A @ B * alpha / rank [N, out].

  A [in, r] starts as PEFT's (uniform within +-1/sqrt(in)); B [r, out] at zero, so the
  adapted model starts as the base. Both are `nnx.LoRAParam`s, which is how the update
  and the checkpoints tell them from the frozen base.
  """

  def __init__(self, in_dim: int, out_dim: int, names: tuple[str, str],
               lora: settings_lib.LoraSettings, dtype: str, *, rngs: nnx.Rngs):
    init = nnx.initializers.variance_scaling(1 / 3, "fan_in", "uniform")
    self.a = nnx.LoRAParam(init(rngs.params(), (in_dim, lora.rank), jnp.float32),
                           out_sharding=(names[0], None))
    self.b = nnx.LoRAParam(jnp.zeros((lora.rank, out_dim), jnp.float32),
                           out_sharding=(None, names[1]))
    self.scale = lora.alpha / lora.rank
    self.dtype = dtype

  def __call__(self, rows_YI: jax.Array) -> jax.Array:
    dt = jnp.dtype(self.dtype)
    return (rows_YI.astype(dt) @ self.a[...].astype(dt)) @ self.b[...].astype(dt) * self.scale


def _adapters(module: nnx.Module, cfg: ModelConfig, names: dict[str, tuple[str, str]],
              rngs: nnx.Rngs) -> None:
  """`<projection>_lora` beside each projection of `names` that `cfg.lora` targets
  (None otherwise); created after the projections, so the base draws no other numbers."""
  for name, axes in names.items():
    adapter = None
    if cfg.lora.enabled and name in cfg.lora.targets:
      adapter = LoRA(*cfg.projection_dims(name), axes, cfg.lora, cfg.dtype, rngs=rngs)
    setattr(module, f"{name}_lora", adapter)


def _project(module: nnx.Module, name: str, rows_YI: jax.Array) -> jax.Array:
  """Projection `name` of `module`, plus its adapter when it has one."""
  out = getattr(module, name)(rows_YI)
  adapter = getattr(module, f"{name}_lora")
  return out if adapter is None else out + adapter(rows_YI)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, names=("norm",)):
    self.weight = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=names)
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * self.weight[...]).astype(x.dtype)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, q, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    init = nnx.initializers.normal(0.02)
    zeros = nnx.initializers.zeros_init()
    self.cfg = cfg
    linear = lambda i, o, names, bias: nnx.Linear(
        i, o, use_bias=bias, dtype=jnp.dtype(cfg.dtype), rngs=rngs,
        kernel_init=_param(init, names), bias_init=_param(zeros, names[1:]))
    self.q_proj = linear(d, q * h, ("embed", "heads"), cfg.qkv_bias)
    self.k_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
    self.v_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
    self.o_proj = linear(q * h, d, ("heads", "embed"), False)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.rms_norm_eps, ("head_dim",))
      self.k_norm = RMSNorm(h, cfg.rms_norm_eps, ("head_dim",))
    _adapters(self, cfg, {"q_proj": ("embed", "heads"), "k_proj": ("embed", "kv_heads"),
                          "v_proj": ("embed", "kv_heads"), "o_proj": ("heads", "embed")}, rngs)

  def qkv(self, x_BSD, rope: rope_lib.Rope):
    cfg = self.cfg
    b, s, d = x_BSD.shape
    rows = x_BSD.reshape(b * s, d)
    q = _project(self, "q_proj", rows).reshape(b, s, cfg.num_heads, cfg.head_dim)
    k = _project(self, "k_proj", rows).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
    v = _project(self, "v_proj", rows).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return rope_lib.apply_rope(q, rope), rope_lib.apply_rope(k, rope), v

  def attend(self, q_BSQH, k_BSKH, v_BSKH, mask_BSS):
    """Full attention of S queries over the keys of the same S positions (training
    forward and prefill).

    `jax.nn.dot_product_attention` runs XLA's einsum-softmax-einsum, which holds
    [B, Q, S, S] scores, unless `attention_impl` is "cudnn": cuDNN's fused kernel (GPUs,
    bfloat16), given a key to attend to on the rows the mask leaves empty (left padding:
    their outputs are never read), so no row's softmax is over nothing. With
    `attention_chunk` = C, queries go through in blocks of C, each rematerialised in the
    backward pass, so at most [B, Q, C, S] scores exist at once (exact: every block sees
    all its keys).
    """
    impl = settings_lib.attention_implementation(
        self.cfg.attention_impl, dtype=self.cfg.dtype, head_dim=self.cfg.head_dim,
        backend=jax.default_backend(), capability=_compute_capability())
    if impl == "cudnn" and jax.default_backend() != "gpu":
      raise ValueError(f"model.attention_impl='cudnn' needs a GPU; this backend is "
                       f"{jax.default_backend()!r}: expected model.attention_impl='xla'")

    def attend(q, mask):
      if impl == "cudnn":
        mask = mask | (~mask.any(-1, keepdims=True) & (jnp.arange(mask.shape[-1]) == 0))
      return jax.nn.dot_product_attention(
          q, k_BSKH, v_BSKH, mask=mask[:, None], scale=self.cfg.head_dim ** -0.5,
          implementation=impl)
    chunk, s = self.cfg.attention_chunk, q_BSQH.shape[1]
    if not chunk or s <= chunk:
      return attend(q_BSQH, mask_BSS)
    pad = -s % chunk  # padded query rows attend to nothing and are cut off below
    padded = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    blocks = lambda x: jnp.moveaxis(
        x.reshape(x.shape[0], (s + pad) // chunk, chunk, *x.shape[2:]), 1, 0)
    out = jax.lax.map(lambda xs: jax.checkpoint(attend)(*xs),
                      (blocks(padded(q_BSQH)), blocks(padded(mask_BSS))))  # [J, B, C, Q, H]
    return jnp.moveaxis(out, 0, 1).reshape(q_BSQH.shape[0], s + pad, *q_BSQH.shape[2:])[:, :s]


def _compute_capability() -> str:
  return str(getattr(jax.devices()[0], "compute_capability", "") or "")


def token_rows(fn: Callable[[jax.Array], jax.Array], x_BSD: jax.Array) -> jax.Array:
  """`fn` applied to the B * S token rows of `x_BSD` as one [B * S, D] matrix.

  Every projection goes through here so that its matmuls are 2-D. The weight gradient
  of a 3-D [B, S, D] x [D, mlp_dim] product contracts two axes, and XLA:CPU lays its operand
  out with a 3-D transpose fused into the elementwise backward of the activation, far
  slower than the 2-D transpose it needs otherwise (docs/performance.md covers the
  update step's speed). Rows stay split over `batch`: B is the major part of B * S.
  """
  b, s = x_BSD.shape[:2]
  y = fn(x_BSD.reshape(b * s, *x_BSD.shape[2:]))
  return y.reshape(b, s, *y.shape[1:])


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(0.02)
    linear = lambda i, o, names: nnx.Linear(
        i, o, use_bias=False, dtype=jnp.dtype(cfg.dtype), rngs=rngs,
        kernel_init=_param(init, names))
    self.gate_proj = linear(cfg.embed_dim, cfg.mlp_dim, ("embed", "mlp"))
    self.up_proj = linear(cfg.embed_dim, cfg.mlp_dim, ("embed", "mlp"))
    self.down_proj = linear(cfg.mlp_dim, cfg.embed_dim, ("mlp", "embed"))
    _adapters(self, cfg, {"gate_proj": ("embed", "mlp"), "up_proj": ("embed", "mlp"),
                          "down_proj": ("mlp", "embed")}, rngs)

  def __call__(self, x_BSD):
    project = functools.partial(_project, self)
    return token_rows(lambda rows: project("down_proj", jax.nn.silu(
        project("gate_proj", rows)) * project("up_proj", rows)), x_BSD)


# attention(q [B,S,Q,H], k [B,S,K,H], v [B,S,K,H]) -> (output [B,S,Q,H], aux): how a
# block attends in one mode (training, prefill or decode) and what that mode keeps.
AttentionFn = Callable[[jax.Array, jax.Array, jax.Array], tuple[jax.Array, Any]]


class Block(nnx.Module):
  """Pre-norm decoder block; the one code path of training, prefill and decode."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps)
    self.mlp = MLP(cfg, rngs=rngs)

  def __call__(self, x_BSD, rope: rope_lib.Rope, attention: AttentionFn):
    q, k, v = self.attn.qkv(self.input_norm(x_BSD), rope)
    out_BSQH, aux = attention(q, k, v)
    x_BSD = x_BSD + token_rows(functools.partial(_project, self.attn, "o_proj"),
                               out_BSQH.reshape(*out_BSQH.shape[:2], -1))
    x_BSD = x_BSD + self.mlp(self.post_attn_norm(x_BSD))
    return sharding.constrain(x_BSD, ACTIVATION_AXES), aux


def _stacked_blocks(cfg: ModelConfig, rngs: nnx.Rngs) -> Block:
  """One Block whose parameters carry a leading `layers` axis of size num_layers.

  The layers are initialised one after another from `rngs` (the draws of an unrolled
  stack), then stacked into the layout `nnx.vmap` gives, whose partition metadata
  names the new axis `layers`.
  """
  blocks = [Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)]

  @nnx.vmap(in_axes=0, out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
  def make(keys):
    return Block(cfg, rngs=nnx.Rngs(keys))
  stacked = nnx.eval_shape(lambda: make(jax.random.split(jax.random.key(0), cfg.num_layers)))
  state = nnx.state(stacked)
  nnx.replace_by_pure_dict(state, jax.tree.map(
      lambda *xs: jnp.stack(xs), *[nnx.to_pure_dict(nnx.state(b)) for b in blocks]))
  nnx.update(stacked, state)
  return stacked


def remat(fn: Callable, policy: str) -> Callable:
  """`fn` rematerialised in the backward pass: none | full | a REMAT_POLICIES name
  (validated by `ModelConfig`)."""
  if policy == "none":
    return fn
  if policy == "full":
    return jax.checkpoint(fn, prevent_cse=False)
  return jax.checkpoint(fn, prevent_cse=False, policy=getattr(jax.checkpoint_policies, policy))


class Transformer(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    # Logical names are metadata only; `sharding.state_shardings` places the state.
    with nnx.use_eager_sharding(False):
      self._build(cfg, rngs)

  def _build(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = nnx.Embed(cfg.vocab_size, cfg.embed_dim, rngs=rngs,
                           embedding_init=_param(nnx.initializers.normal(0.02),
                                                 ("vocab", "embed")))
    self.layers = _stacked_blocks(cfg, rngs)
    self.final_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps)
    if not cfg.tie_embeddings:
      self.lm_head = nnx.Linear(
          cfg.embed_dim, cfg.vocab_size, use_bias=False, rngs=rngs,
          kernel_init=_param(nnx.initializers.normal(0.02), ("embed", "vocab")))

  def with_dtype(self, dtype: str) -> Transformer:
    """This model's parameters (the same arrays) in a model whose activations, and so its
    prefill and decode caches, are `dtype` (`ModelConfig.dtype`); itself if they are.

    The activation dtype is part of the module graph (each projection casts its inputs
    and kernel to it), so the graph is rebuilt, shapes only, for the new config.
    """
    if dtype == self.cfg.dtype:
      return self
    graphdef = nnx.graphdef(abstract_model(dataclasses.replace(self.cfg, dtype=dtype)))
    return nnx.merge(graphdef, nnx.state(self))

  # -- pieces ---------------------------------------------------------------
  def rope(self, positions_BS, num_positions: int) -> rope_lib.Rope:
    cfg = self.cfg
    return rope_lib.rope_tables(positions_BS, rope_lib.rope_inverse_frequencies(
        cfg.head_dim, cfg.rope_theta, cfg.rope_scaling), num_positions)

  def embed_tokens(self, tokens):
    return sharding.constrain(self.embed(tokens).astype(jnp.dtype(self.cfg.dtype)),
                              ACTIVATION_AXES)

  def scan_layers(self, layer_fn, carry, xs=None):
    """`lax.scan` of `layer_fn(block, carry, x) -> (carry, y)` over the stacked layers.

    One traced block whatever the depth, so compile time does not grow with it; the
    step is rematerialised per `cfg.remat` when it is differentiated.
    """
    graphdef, stacked = nnx.split(self.layers)

    def step(carry, layer):
      layer_state, x = layer
      return layer_fn(nnx.merge(graphdef, layer_state), carry, x)
    return jax.lax.scan(remat(step, self.cfg.remat), carry, (stacked, xs))

  def logits(self, h_BSD):
    """LM head on final hidden states (float32 products when `fp32_lm_head`)."""
    h = self.final_norm(h_BSD)
    w_DV = self.embed.embedding[...].T if self.cfg.tie_embeddings else self.lm_head.kernel[...]
    return token_rows(lambda rows: head_lib.head_matmul(
        rows, w_DV, fp32=self.cfg.fp32_lm_head, precision=self.cfg.lm_head_precision), h)

  # -- entry points ---------------------------------------------------------
  def causal_inputs(self, mask_BS):
    positions_BS = jnp.maximum(jnp.cumsum(mask_BS, axis=-1) - 1, 0)
    s = mask_BS.shape[1]
    mask_BSS = jnp.tril(jnp.ones((s, s), bool))[None] & mask_BS[:, None, :]
    return positions_BS, mask_BSS

  def hidden_states(self, tokens_BS, mask_BS):
    """Uncached causal forward; `mask_BS` is False on padding. Returns [B, S, D]."""
    positions, mask_BSS = self.causal_inputs(mask_BS)
    rope = self.rope(positions, mask_BS.shape[1])

    def layer(block, x, _):
      return block(x, rope, lambda q, k, v: (block.attn.attend(q, k, v, mask_BSS), None))
    x, _ = self.scan_layers(layer, self.embed_tokens(tokens_BS))
    return x

  def __call__(self, tokens_BS, mask_BS):
    return self.logits(self.hidden_states(tokens_BS, mask_BS))

def abstract_model(cfg: ModelConfig) -> Transformer:
  """A Transformer of `cfg` with shapes for parameters (nothing is initialised).

  Built outside any mesh, also when called under one (a sampler traced under
  `jax.set_mesh`): `nnx.eval_shape` would place the shapes on the current mesh by their
  logical axis names, which are not mesh axes.
  """
  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
