"""What each pass of a step holds in memory, from the model's shape: the update's
activations under each remat policy, scoring, a sampler call's caches, the weights and
the optimizer. `memory_plan` sizes the passes from these.

Each estimate is an upper bound on XLA's own accounting of the same programs
(`tests/core/test_memory_estimates.py` compiles them and compares), not a measurement.
Pure Python: no JAX import, so the planner and the config layer can use it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# XLA keeps more of a pass alive than the activations counted below (its own copies
# and layouts); measured against its buffer assignment on CPU.
UPDATE_MARGIN = 1.3


@dataclasses.dataclass(frozen=True)
class Shape:
  """What the estimate needs of a model (a `transformer.ModelConfig`'s numbers)."""
  vocab_size: int
  num_layers: int
  embed_dim: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  mlp_dim: int
  tie_embeddings: bool
  activation_bytes: int = 4   # float32; 2 for bfloat16 activations
  remat: str = "none"         # `model.remat`: what the backward pass recomputes

  @classmethod
  def of(cls, cfg: Any) -> "Shape":
    return cls(vocab_size=cfg.vocab_size, num_layers=cfg.num_layers, embed_dim=cfg.embed_dim,
               num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
               mlp_dim=cfg.mlp_dim, tie_embeddings=cfg.tie_embeddings,
               activation_bytes=2 if cfg.dtype == "bfloat16" else 4, remat=cfg.remat)

  @property
  def params(self) -> int:
    d, q, kv = self.embed_dim, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    layer = d * q + 2 * d * kv + q * d + 3 * d * self.mlp_dim + 2 * d + q + 2 * kv
    head = 0 if self.tie_embeddings else self.vocab_size * d
    return self.vocab_size * d + self.num_layers * layer + d + head

  def layer_floats_per_token(self) -> int:
    """Activations one layer keeps per token for its backward pass, in the model's dtype,
    besides attention's scores (`score_bytes_per_token`)."""
    d, q, kv = self.embed_dim, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    return 8 * d + 3 * q + 3 * kv + 5 * self.mlp_dim

  def score_bytes_per_token(self, keys: int) -> int:
    """One copy of a token's attention scores over `keys`, every head: float32 whatever
    the model's dtype (the score einsum accumulates in float32)."""
    return self.num_heads * keys * 4

  def saved_bytes_per_token(self, keys: int) -> int | None:
    """What `remat`'s policy keeps of a layer per token besides its input: None for all
    of it (no remat), 0 for nothing (full remat), else the matmul outputs the backward
    pass reads: the q/k/v, o, gate and up projections (dots without batch dims), and
    with batch dims also the attention scores (float32 whatever the model's dtype: the
    score einsum accumulates in float32) and the attention output. LoRA's rank-wide
    adapter products are not counted."""
    if self.remat in ("none", "everything_saveable"):
      return None
    if self.remat in ("full", "nothing_saveable"):
      return 0
    d, q, kv = self.embed_dim, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    projections = (q + 2 * kv + d + 2 * self.mlp_dim) * self.activation_bytes
    if self.remat in ("dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims"):
      return projections
    if self.remat in ("dots_saveable", "checkpoint_dots"):  # jax's aliases
      return projections + q * self.activation_bytes + self.score_bytes_per_token(keys)
    raise ValueError(f"model.remat={self.remat!r}: no memory estimate for this policy")


def update_bytes(shape: Shape, rows: int, seq: int, response: int, chunk: int) -> int:
  """Temporaries of one forward/backward pass over `rows` sequences of `seq` tokens,
  the LM head over `response` positions in chunks of `chunk` (0: all at once).

  A layer keeps its activations and two copies of its attention scores (the scores and
  their softmax); the layer the backward pass is in holds two more (their gradients).
  Without those two (and with the scores in the model's dtype), the estimate at 512
  tokens was down to 0.84x of XLA's bytes."""
  tokens = rows * seq
  scores = shape.score_bytes_per_token(seq)
  per_layer = shape.layer_floats_per_token() * shape.activation_bytes + 2 * scores
  saved = shape.saved_bytes_per_token(seq)
  if saved is None:
    kept = shape.num_layers * per_layer
  else:  # layer inputs and what the policy saves kept, one layer recomputed at a time
    kept = shape.num_layers * (shape.embed_dim * 4 + saved) + per_layer
  layers = tokens * (kept + 2 * scores)  # and the backward layer's score gradients
  positions = chunk if 0 < chunk < response else response
  # Float32 logits, their exponentials and their gradient, for one chunk; the final
  # hidden states and their gradient over the whole response.
  head = rows * positions * shape.vocab_size * 4 * 3 + 2 * rows * response * shape.embed_dim * 4
  return int(UPDATE_MARGIN * (layers + head))


def score_bytes(shape: Shape, rows: int, seq: int, response: int, chunk: int) -> int:
  """Temporaries of one forward pass (no gradient): a layer's activations at a time,
  three copies of its attention scores (XLA held 3.1 at 512 tokens; counting one, the
  estimate was 0.47-0.65x of XLA's bytes), and two of a chunk's float32 logits."""
  positions = chunk if 0 < chunk < response else response
  return (rows * seq * (shape.layer_floats_per_token() * shape.activation_bytes // 2
                        + 3 * shape.score_bytes_per_token(seq))
          + rows * positions * shape.vocab_size * 4 * 2)


def sample_bytes(shape: Shape, rollouts: int, prompt: int, new_tokens: int,
                 cache_bytes: int = 4) -> int:
  """One sampler call of `rollouts`: the decode cache of every layer (prompt and
  generated slots), a prefill layer's activations, and a decode step's logits."""
  kv = 2 * shape.num_kv_heads * shape.head_dim * shape.num_layers * cache_bytes
  cache = rollouts * (prompt + new_tokens) * kv
  # The prefill's scores in the model's dtype, as this estimate always counted them: it
  # is above XLA's bytes anyway (tests/core/test_memory_estimates.py), and a larger count
  # would split CPU runs' sampler calls differently, and so change their draws.
  prefill = rollouts * prompt * (shape.layer_floats_per_token() * shape.activation_bytes
                                 + 2 * shape.num_heads * prompt * shape.activation_bytes)
  return cache + prefill + rollouts * shape.vocab_size * 4 * 4


def resident_bytes(shape: Shape, *, trained_params: int, reference: bool) -> int:
  """Weights and the reference copy; the trained weights' gradient, Adam moments and
  update."""
  return 4 * shape.params * (1 + int(reference)) + 4 * 4 * trained_params


def lora_params(model_cfg: Any) -> int:
  """Adapter parameters: rank x (in + out) of each target projection, every layer."""
  lora = model_cfg.lora
  return model_cfg.num_layers * sum(lora.rank * sum(model_cfg.projection_dims(t))
                                    for t in lora.targets)
