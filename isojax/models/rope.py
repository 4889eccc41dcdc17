"""Rotary position embeddings: the inverse frequencies (with Llama 3's frequency-dependent
scaling), the per-position (cos, sin) tables one forward or decode step shares across
layers, and the rotate-half rotation of queries and keys (the Hugging Face Llama/Qwen
convention, so checkpoints load without permuting their projections)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


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


# (cos, sin) of every position's rotary angles, [B, S, F] each.
Rope = tuple[jax.Array, jax.Array]


def rope_tables(positions_BS, inv_freq_F, num_positions: int) -> Rope:
  """The rotary tables of `positions_BS` (each below `num_positions`): computed once per
  forward or decode step and shared by every layer's queries and keys.

  The cos and sin of every position in [0, num_positions) are computed once and the rows
  of `positions_BS` gathered from them: computed at the positions themselves, XLA fuses
  the cos and sin into each layer's rotation and evaluates them again for every element
  of every head.
  """
  angles_SF = jnp.arange(num_positions, dtype=jnp.float32)[:, None] * inv_freq_F
  return jnp.cos(angles_SF)[positions_BS], jnp.sin(angles_SF)[positions_BS]  # [B, S, F]


def apply_rope(x, rope: Rope):
  """Rotate-half RoPE (the Hugging Face Llama/Qwen convention) of queries [B, S, Q, H] or
  keys [B, S, K, H]."""
  cos, sin = (t[:, :, None, :] for t in rope)
  x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x.dtype)
