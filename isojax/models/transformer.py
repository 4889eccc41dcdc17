"""One Flax NNX decoder-only transformer for the Llama 3 / Qwen2.5 / Qwen3 family.

RMSNorm, rotary embeddings (with Llama 3 frequency scaling), grouped-query attention,
SwiGLU, optional qkv bias (Qwen2.5), optional per-head q/k RMSNorm (Qwen3), tied or
untied embeddings. Every parameter carries logical axis names (`embed`, `heads`,
`kv_heads`, `mlp`, `vocab`, `head_dim`); `isojax.models.sharding` maps them to mesh axes.

Three entry points share the same layers:
  `__call__`  uncached forward over whole sequences (training, tests);
  `prefill`   forward over left-padded prompts, returning each layer's keys/values;
  `decode`    one new token per rollout attending to the *shared* prompt cache of its
              group ([G, P] keys, never copied n times) plus its own generated cache.
Sharing the prompt cache is what makes n rollouts per problem cheap: the prompt is
encoded once per problem and its keys/values are stored once, whatever n is.
"""

from __future__ import annotations

import dataclasses
import math

import flax
import jax
import jax.numpy as jnp
from flax import nnx

NEG_INF = -1e30


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

  def __post_init__(self):
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")


@flax.struct.dataclass
class PrefixCache:
  """Keys/values of the left-padded prompts, one entry per group (problem)."""
  k: jax.Array     # [L, G, P, K, H]
  v: jax.Array     # [L, G, P, K, H]
  mask: jax.Array  # [G, P] bool, False on left padding


@flax.struct.dataclass
class DecodeCache:
  """Keys/values of generated tokens, one entry per rollout (B = G * n)."""
  k: jax.Array     # [L, B, T, K, H]
  v: jax.Array     # [L, B, T, K, H]


def _param(init, names):
  return nnx.with_partitioning(init, names)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, names=("norm",)):
    self.weight = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=names)
    self.eps = eps

  def __call__(self, x):
    x32 = x.astype(jnp.float32)
    x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return (x32 * self.weight[...]).astype(x.dtype)


def rope_inverse_frequencies(head_dim: int, theta: float, scaling: dict | None) -> jax.Array:
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  if not scaling or scaling.get("rope_type", scaling.get("type")) in (None, "default"):
    return inv_freq
  if scaling.get("rope_type", scaling.get("type")) != "llama3":
    raise ValueError(f"rope_scaling {scaling}: only 'llama3' scaling is supported")
  # Llama 3.1 frequency-dependent scaling (same formula as transformers).
  factor = scaling["factor"]
  low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
  old_len = scaling["original_max_position_embeddings"]
  wavelen = 2 * math.pi / inv_freq
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
  scaled = jnp.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
  is_medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
  return jnp.where(is_medium, smoothed, scaled)


def apply_rope(x_BSNH, positions_BS, inv_freq_F):
  """Rotate-half RoPE (the Hugging Face Llama/Qwen convention)."""
  angles = positions_BS[..., None].astype(jnp.float32) * inv_freq_F  # [B, S, H/2]
  cos = jnp.cos(angles)[:, :, None, :]
  sin = jnp.sin(angles)[:, :, None, :]
  x = x_BSNH.astype(jnp.float32)
  x1, x2 = jnp.split(x, 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x_BSNH.dtype)


def _softmax_weights(scores, mask):
  scores = jnp.where(mask, scores.astype(jnp.float32), NEG_INF)
  return jax.nn.softmax(scores, axis=-1)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    d, n, k, h = cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    init = nnx.initializers.normal(0.02)
    zeros = nnx.initializers.zeros_init()
    self.cfg = cfg
    linear = lambda i, o, names, bias: nnx.Linear(
        i, o, use_bias=bias, rngs=rngs, kernel_init=_param(init, names),
        bias_init=_param(zeros, names[1:]))
    self.q_proj = linear(d, n * h, ("embed", "heads"), cfg.qkv_bias)
    self.k_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
    self.v_proj = linear(d, k * h, ("embed", "kv_heads"), cfg.qkv_bias)
    self.o_proj = linear(n * h, d, ("heads", "embed"), False)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.rms_norm_eps, ("head_dim",))
      self.k_norm = RMSNorm(h, cfg.rms_norm_eps, ("head_dim",))

  def qkv(self, x_BSD, positions_BS, inv_freq):
    cfg = self.cfg
    b, s, _ = x_BSD.shape
    q = self.q_proj(x_BSD).reshape(b, s, cfg.num_heads, cfg.head_dim)
    k = self.k_proj(x_BSD).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
    v = self.v_proj(x_BSD).reshape(b, s, cfg.num_kv_heads, cfg.head_dim)
    if cfg.qk_norm:
      q, k = self.q_norm(q), self.k_norm(k)
    return apply_rope(q, positions_BS, inv_freq), apply_rope(k, positions_BS, inv_freq), v

  def _grouped(self, q_BSNH):
    b, s, _, h = q_BSNH.shape
    return q_BSNH.reshape(b, s, self.cfg.num_kv_heads, -1, h)  # [B, S, K, R, H]

  def attend(self, q_BSNH, k_BTKH, v_BTKH, mask_BST):
    """Full attention of S queries over T keys (training forward and prefill)."""
    scale = self.cfg.head_dim ** -0.5
    q = self._grouped(q_BSNH)
    scores = jnp.einsum("bskrh,btkh->bkrst", q, k_BTKH) * scale
    w = _softmax_weights(scores, mask_BST[:, None, None]).astype(v_BTKH.dtype)
    out = jnp.einsum("bkrst,btkh->bskrh", w, v_BTKH)
    return self.o_proj(out.reshape(*out.shape[:2], -1))

  def attend_decode(self, q_B1NH, prefix_k_GPKH, prefix_v_GPKH, prefix_mask_GP,
                    k_BTKH, v_BTKH, mask_BT):
    """One query per rollout over its group's prompt cache plus its own cache."""
    g = prefix_k_GPKH.shape[0]
    b = q_B1NH.shape[0]
    scale = self.cfg.head_dim ** -0.5
    q = self._grouped(q_B1NH)[:, 0]                              # [B, K, R, H]
    q_g = q.reshape(g, b // g, *q.shape[1:])                     # [G, n, K, R, H]
    s_prefix = jnp.einsum("gnkrh,gpkh->gnkrp", q_g, prefix_k_GPKH) * scale
    s_prefix = s_prefix.reshape(b, *s_prefix.shape[2:])          # [B, K, R, P]
    s_own = jnp.einsum("bkrh,btkh->bkrt", q, k_BTKH) * scale      # [B, K, R, T]
    prefix_mask = jnp.repeat(prefix_mask_GP, b // g, axis=0)     # [B, P]
    mask = jnp.concatenate([prefix_mask, mask_BT], axis=-1)[:, None, None]
    w = _softmax_weights(jnp.concatenate([s_prefix, s_own], axis=-1), mask)
    p = prefix_k_GPKH.shape[1]
    w_prefix = w[..., :p].astype(v_BTKH.dtype).reshape(g, b // g, *w.shape[1:3], p)
    out = jnp.einsum("gnkrp,gpkh->gnkrh", w_prefix, prefix_v_GPKH).reshape(b, *q.shape[1:])
    out = out + jnp.einsum("bkrt,btkh->bkrh", w[..., p:].astype(v_BTKH.dtype), v_BTKH)
    return self.o_proj(out.reshape(b, 1, -1))


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    init = nnx.initializers.normal(0.02)
    linear = lambda i, o, names: nnx.Linear(
        i, o, use_bias=False, rngs=rngs, kernel_init=_param(init, names))
    self.gate_proj = linear(cfg.embed_dim, cfg.mlp_dim, ("embed", "mlp"))
    self.up_proj = linear(cfg.embed_dim, cfg.mlp_dim, ("embed", "mlp"))
    self.down_proj = linear(cfg.mlp_dim, cfg.embed_dim, ("mlp", "embed"))

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nnx.Module):

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.input_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps)
    self.attn = Attention(cfg, rngs=rngs)
    self.post_attn_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps)
    self.mlp = MLP(cfg, rngs=rngs)

  def finish(self, x, attn_out):
    x = x + attn_out
    return x + self.mlp(self.post_attn_norm(x))


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
    self.layers = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.embed_dim, cfg.rms_norm_eps)
    if not cfg.tie_embeddings:
      self.lm_head = nnx.Linear(
          cfg.embed_dim, cfg.vocab_size, use_bias=False, rngs=rngs,
          kernel_init=_param(nnx.initializers.normal(0.02), ("embed", "vocab")))

  # -- pieces ---------------------------------------------------------------
  @property
  def _inv_freq(self):
    return rope_inverse_frequencies(self.cfg.head_dim, self.cfg.rope_theta,
                                    self.cfg.rope_scaling)

  def _embed(self, tokens):
    return self.embed(tokens).astype(jnp.dtype(self.cfg.dtype))

  def logits(self, h_BSD):
    """LM head on final hidden states (float32 when `fp32_lm_head`)."""
    h = self.final_norm(h_BSD)
    dtype = jnp.float32 if self.cfg.fp32_lm_head else h.dtype
    if self.cfg.tie_embeddings:
      w = self.embed.embedding[...].astype(dtype)
      return jnp.einsum("bsd,vd->bsv", h.astype(dtype), w)
    return jnp.einsum("bsd,dv->bsv", h.astype(dtype),
                      self.lm_head.kernel[...].astype(dtype))

  # -- entry points ---------------------------------------------------------
  def hidden_states(self, tokens_BS, mask_BS):
    """Uncached causal forward; `mask_BS` is False on padding. Returns [B, S, D]."""
    positions = jnp.maximum(jnp.cumsum(mask_BS, axis=-1) - 1, 0)
    s = tokens_BS.shape[1]
    causal = jnp.tril(jnp.ones((s, s), bool))
    attn_mask = causal[None] & mask_BS[:, None, :]
    x = self._embed(tokens_BS)
    for layer in self.layers:
      q, k, v = layer.attn.qkv(layer.input_norm(x), positions, self._inv_freq)
      x = layer.finish(x, layer.attn.attend(q, k, v, attn_mask))
    return x

  def __call__(self, tokens_BS, mask_BS):
    return self.logits(self.hidden_states(tokens_BS, mask_BS))

  def prefill(self, tokens_GP, mask_GP):
    """Encodes left-padded prompts once. Returns (last-token logits [G, V], cache)."""
    positions = jnp.maximum(jnp.cumsum(mask_GP, axis=-1) - 1, 0)
    p = tokens_GP.shape[1]
    attn_mask = jnp.tril(jnp.ones((p, p), bool))[None] & mask_GP[:, None, :]
    x = self._embed(tokens_GP)
    ks, vs = [], []
    for layer in self.layers:
      q, k, v = layer.attn.qkv(layer.input_norm(x), positions, self._inv_freq)
      ks.append(k)
      vs.append(v)
      x = layer.finish(x, layer.attn.attend(q, k, v, attn_mask))
    cache = PrefixCache(k=jnp.stack(ks), v=jnp.stack(vs), mask=mask_GP)
    return self.logits(x[:, -1:])[:, 0], cache

  def init_decode_cache(self, batch: int, length: int) -> DecodeCache:
    cfg = self.cfg
    shape = (cfg.num_layers, batch, length, cfg.num_kv_heads, cfg.head_dim)
    zeros = jnp.zeros(shape, jnp.dtype(cfg.dtype))
    return DecodeCache(k=zeros, v=zeros)

  def decode(self, token_B, position_B, step, prefix: PrefixCache, cache: DecodeCache):
    """Feeds one token per rollout at decode slot `step`. Returns (logits [B, V], cache)."""
    x = self._embed(token_B[:, None])
    own_mask = jnp.arange(cache.k.shape[2])[None, :] <= step      # [1, T]
    own_mask = jnp.broadcast_to(own_mask, (token_B.shape[0], cache.k.shape[2]))
    new_k, new_v = cache.k, cache.v
    for i, layer in enumerate(self.layers):
      q, k, v = layer.attn.qkv(layer.input_norm(x), position_B[:, None], self._inv_freq)
      new_k = jax.lax.dynamic_update_slice(new_k, k[None].astype(new_k.dtype), (i, 0, step, 0, 0))
      new_v = jax.lax.dynamic_update_slice(new_v, v[None].astype(new_v.dtype), (i, 0, step, 0, 0))
      out = layer.attn.attend_decode(q, prefix.k[i], prefix.v[i], prefix.mask,
                                     new_k[i], new_v[i], own_mask)
      x = layer.finish(x, out)
    return self.logits(x)[:, 0], DecodeCache(k=new_k, v=new_v)
