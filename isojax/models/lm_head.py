"""The LM head's product: float32 logits from the final hidden states, at the
precision `model.fp32_lm_head` and `model.lm_head_precision` ask for."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def head_matmul(rows_YD: jax.Array, w_DV: jax.Array, *, fp32: bool,
                precision: str = "highest") -> jax.Array:
  """The LM head's product; with `fp32`, float32 logits.

  An f32 dot at the default precision is one bfloat16 pass on TPU and TF32 on recent
  GPUs, so upcasting alone would not give float32 logits (ScaleRL's fix for the
  sampler/trainer mismatch): float32 operands multiply at `Precision.HIGHEST` (on TPU
  about 6x the head's FLOPs; CPUs always multiply f32 in full). Operands that share a
  16-bit float dtype (bfloat16 sampling weights and activations) are multiplied as they
  are with float32 accumulation: every product of two is exact in float32, so this is
  the same as upcasting both, without the HIGHEST passes or a float32 copy of the head.
  Without `fp32` the product runs in the activations' dtype.

  `precision` (`model.lm_head_precision`, "auto" resolved by `head_precision`) is for
  bfloat16 activations on float32 weights, the training forward of a bfloat16 model:
  "highest" upcasts the activations; "bf16x2" splits each weight into bfloat16 parts
  hi + lo (|w - hi - lo| <= 2^-17 |w|) and adds the two bfloat16 products in float32,
  so the logits are those of float32 products to that bound, on tensor cores. Its
  gradient flows through hi only, as every bfloat16 layer's does through its cast.
  """
  if not fp32:
    return rows_YD @ w_DV.astype(rows_YD.dtype)
  if rows_YD.dtype == w_DV.dtype and jnp.finfo(rows_YD.dtype).bits == 16:
    return jnp.matmul(rows_YD, w_DV, preferred_element_type=jnp.float32)
  if (head_precision(precision) == "bf16x2" and rows_YD.dtype == jnp.bfloat16
      and w_DV.dtype == jnp.float32):
    hi_DV = w_DV.astype(jnp.bfloat16)
    lo_DV = jax.lax.stop_gradient((w_DV - hi_DV.astype(jnp.float32)).astype(jnp.bfloat16))
    return (jnp.matmul(rows_YD, hi_DV, preferred_element_type=jnp.float32)
            + jnp.matmul(jax.lax.stop_gradient(rows_YD), lo_DV,
                         preferred_element_type=jnp.float32))
  return jnp.matmul(rows_YD.astype(jnp.float32), w_DV.astype(jnp.float32),
                    precision=jax.lax.Precision.HIGHEST)


def head_precision(setting: str) -> str:
  """`model.lm_head_precision` as traced: "auto" is "bf16x2" on GPUs, whose float32
  products run on CUDA cores at a fraction of the tensor cores' rate (on one H100 they
  took about half of a 1.5B model's update), and "highest" elsewhere."""
  if setting != "auto":
    return setting
  return "bf16x2" if jax.default_backend() == "gpu" else "highest"
