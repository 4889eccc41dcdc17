"""Forced interruptions (ScaleRL): a rollout still thinking at its budget is made to stop.

Both decoding schedules (`lockstep`, `continuous`) write the same interruption text at
the same positions and end an interrupted rollout at the same length, so the rule lives
here once, as methods of the spec's `Interruption`: which token is forced where, when
thinking has ended, and which positions are context rather than actions. The tokens
are counted from the texts with the policy's tokenizer by `rl.rollout.interruption`;
the settings are checked in `sampling.settings`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Interruption:
  """ScaleRL's forced interruption: a rollout still thinking after `think_budget` tokens
  gets `text_ids` written in by the sampler, then at most `answer_budget` more tokens.
  "Still thinking": `think_end_ids` (e.g. the ids of "</think>") not yet generated."""
  think_budget: int
  text_ids: tuple[int, ...]
  answer_budget: int
  think_end_ids: tuple[int, ...]

  @property
  def end(self) -> int:
    """The length at which an interrupted rollout stops."""
    return self.think_budget + len(self.text_ids) + self.answer_budget

  def force(self, position, interrupted, token, logp):
    """(token, logp) with the interruption text written where `position` (the index of
    the token being chosen) falls in its window on an `interrupted` row; log-prob 0."""
    offset = position - self.think_budget
    window = interrupted & (offset >= 0) & (offset < len(self.text_ids))
    text = jnp.asarray(self.text_ids, jnp.int32)[jnp.clip(offset, 0, len(self.text_ids) - 1)]
    return jnp.where(window, text, token), jnp.where(window, 0.0, logp)

  def ends_thinking(self, tokens, position):
    """Whether the `think_end_ids` end at `position` (an index into the last axis of
    `tokens` [..., T], broadcast against `tokens`' leading axes)."""
    size = len(self.think_end_ids)
    position = jnp.broadcast_to(position, tokens.shape[:-1])
    at = position[..., None] - (size - 1) + jnp.arange(size)
    found = jnp.take_along_axis(tokens, jnp.clip(at, 0, tokens.shape[-1] - 1), axis=-1)
    return jnp.all((found == jnp.asarray(self.think_end_ids, jnp.int32)) & (at >= 0), axis=-1)

  def forced_mask(self, interrupted_B, t: int):
    """[B, T]: where the interruption text lies on each interrupted row."""
    positions = jnp.arange(t)
    return interrupted_B[:, None] & (positions >= self.think_budget) & (
        positions < self.think_budget + len(self.text_ids))
