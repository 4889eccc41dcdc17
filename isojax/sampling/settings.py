"""The sampler's settings (`config.sampling`): typed, validated, JAX-free.

`SamplingSettings` holds each field with its default and meaning and checks them; `attended_lengths` is the one rule for
`sampling.decode_block`, used by the check and by the decode step that compiles one
attention branch per length.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from isojax import validation
from isojax.validation import is_int

F = validation.field

# Attention branches a decode step may compile (`decode_block`): T / block of them.
MAX_DECODE_BLOCKS = 64
SAMPLING_DTYPES = ("", "float32", "bfloat16")


def cast_weights_dtype(weights_dtype: str | None, activations: str) -> str | None:
  """The dtype a sampler call casts the weights to, None for as stored (float32):
  `sampling.weights_dtype`, or where that is "" the activations' dtype when it is
  bfloat16. A bfloat16 model's projections already multiply bfloat16 copies of their
  weights; decode reads every weight once a step, so bfloat16 weights halve its bytes
  (on one H100 they halved a 1.5B policy's sampling)."""
  if weights_dtype:
    return weights_dtype
  return "bfloat16" if activations == "bfloat16" else None


def attended_lengths(cache_len: int, block: int) -> tuple[int, ...]:
  """The generated-cache lengths a decode step may attend over: block, 2 * block, ...,
  cache_len (the last one cut to it); one length, the whole cache, when block is 0."""
  if not is_int(block) or block < 0:
    raise ValueError(f"sampling.decode_block={block!r}: expected an integer >= 0 (0: attend "
                     "over the whole generated cache)")
  if not block or block >= cache_len:
    return (cache_len,)
  count = -(-cache_len // block)
  if count > MAX_DECODE_BLOCKS:
    raise ValueError(f"sampling.decode_block={block} cuts a cache of {cache_len} slots into "
                     f"{count} blocks; at most {MAX_DECODE_BLOCKS} (each is compiled): "
                     f"use a block of at least {-(-cache_len // MAX_DECODE_BLOCKS)}")
  return tuple(min((j + 1) * block, cache_len) for j in range(count))


@dataclasses.dataclass(frozen=True)
class SamplingSettings(validation.Section):
  """`config.sampling`: the sampler's distribution, lengths, batching and memory, and
  ScaleRL's forced interruptions ([sampling.md](sampling.md))."""
  temperature: float = F(0.6, "sampling temperature (>= 0)")
  top_p: float = F(1.0, "nucleus mass, in (0, 1]")
  top_k: int = F(0, "top-k; 0 disables")
  max_new_tokens: int = F(8, "T, the response length cap")
  max_rollouts_per_call: int = F(
      0, "rollouts per sampler call (whole groups), training and evaluation; 0 = derived "
      "from the model and the memory ([Memory](#memory-the-passes-of-a-step))")
  weights_dtype: str = F("", "`\"\"` (bfloat16 when the activations are, else as "
                         "trained), `float32` or `bfloat16`: weights cast for sampling")
  dtype: str = F("", "`\"\"` (= `model.dtype`), `float32` or `bfloat16`: the sampler's "
                 "activations and KV caches")
  decode_slots: int = F(0, "> 0: continuous batching in this many decode rows per call")
  decode_slots_min: int = F(0, "> 0: halve the slots down to this many once the queue is "
                            "empty and at most half are busy")
  decode_block: int = F(0, "> 0: attend over the generated cache in blocks of this many "
                        "tokens, only the filled ones")
  stop_token_ids: tuple[int, ...] = F((), "ids that end a rollout besides the "
                                      "checkpoint's EOS ids")
  think_budget: int = F(0, "> 0: forced interruption after this many tokens without "
                        "`think_end_text` ([sampling.md](sampling.md))")
  answer_budget: int = F(0, "tokens an interrupted rollout may generate after the "
                         "interruption text")
  interruption_text: str = F(
      "Okay, time is up. Let me stop thinking and formulate a final answer now. </think>",
      "written in by the sampler at the budget (context, not actions)",
      shown="ScaleRL's \"Okay, time is up. ... </think>\"")
  think_end_text: str = F("</think>", "a rollout that generated it has finished thinking")

  def __post_init__(self):
    if not self.temperature >= 0:
      raise ValueError(f"sampling.temperature={self.temperature}: expected >= 0")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"sampling.top_p={self.top_p}: expected in (0, 1]")
    validation.non_negative_int("sampling.top_k", self.top_k, "0 disables top-k")
    validation.positive_int("sampling.max_new_tokens", self.max_new_tokens)
    validation.non_negative_int("sampling.max_rollouts_per_call", self.max_rollouts_per_call,
                                "0: no limit")
    validation.non_negative_int("sampling.decode_slots", self.decode_slots,
                                "0: all rollouts of a call decode in lockstep")
    validation.non_negative_int("sampling.decode_slots_min", self.decode_slots_min,
                                "0: the continuous-batching slots never shrink")
    if self.decode_slots_min and not self.decode_slots:
      raise ValueError(f"sampling.decode_slots_min={self.decode_slots_min} needs continuous "
                       "batching: set sampling.decode_slots > 0 (or decode_slots_min=0)")
    for field in ("weights_dtype", "dtype"):
      if getattr(self, field) not in SAMPLING_DTYPES:
        raise ValueError(f"sampling.{field}={getattr(self, field)!r}: expected '', float32 or "
                         "bfloat16")
    attended_lengths(self.max_new_tokens, self.decode_block)
    stop = self.stop_token_ids
    if isinstance(stop, int) or not all(is_int(i) and i >= 0 for i in stop):
      raise ValueError(f"sampling.stop_token_ids={stop!r}: expected a tuple of token ids >= 0")
    self._check_interruption()

  def _check_interruption(self) -> None:
    """The rules of forced interruptions that need no tokenizer (`rollout.interruption`
    checks the token counts)."""
    validation.non_negative_int("sampling.think_budget", self.think_budget, "0: off")
    validation.non_negative_int("sampling.answer_budget", self.answer_budget,
                                "tokens after the interruption text")
    if not self.think_budget:
      return
    for field in ("interruption_text", "think_end_text"):
      if not isinstance(getattr(self, field), str) or not getattr(self, field):
        raise ValueError(f"sampling.{field}={getattr(self, field)!r}: expected a non-empty "
                         "string with sampling.think_budget > 0")
    if not self.answer_budget:
      raise ValueError("sampling.answer_budget=0 with sampling.think_budget > 0: an "
                       "interrupted rollout needs >= 1 token to answer")
    if self.think_budget + self.answer_budget >= self.max_new_tokens:
      raise ValueError(
          f"sampling.think_budget={self.think_budget} + sampling.answer_budget="
          f"{self.answer_budget} must leave room for the interruption text within "
          f"sampling.max_new_tokens={self.max_new_tokens}")

  @classmethod
  def from_config(cls, sampling: Mapping[str, Any]) -> SamplingSettings:
    stop = sampling["stop_token_ids"]
    return validation.from_mapping(cls, {
        **sampling, "stop_token_ids": stop if isinstance(stop, int) else tuple(stop)})
