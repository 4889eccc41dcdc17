"""From problems to scored rollouts: prompt encoding, sampling, verification.

Shared by the training loop and evaluation so both see exactly the same prompts,
sampling settings and verifier. Prompts are left-padded to a fixed `prompt_len` for the
whole run, so every call reuses one compiled sampler.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from isojax.models import sharding
from isojax.models.tokenizer import TextTokenizer
from isojax.sampling import sampler


@dataclasses.dataclass
class ScoredRollouts:
  prompts_GP: np.ndarray       # [G, P] int32, left-padded
  prompt_mask_GP: np.ndarray   # [G, P] bool
  rollouts: sampler.Rollouts   # [B, T] host NumPy arrays, B = G * n
  rewards_GN: np.ndarray       # [G, n] float32
  completions: list[str]       # [B] decoded text

  @property
  def num_tokens(self) -> int:
    return int(self.rollouts.mask.sum())


def encode_prompts(tok: TextTokenizer, problems: Sequence, prompt_len: int):
  return tok.encode_batch_left_padded([p.prompt for p in problems], prompt_len)


def generate(graphdef, params, tok: TextTokenizer, problems: Sequence,
             reward_fn: Callable, *, n: int, rng: jax.Array, prompt_len: int,
             sampling: ml_collections.ConfigDict, temperature: float | None = None,
             ) -> ScoredRollouts:
  """Samples n rollouts per problem and scores each with `reward_fn(text, problem)`."""
  prompts, mask = encode_prompts(tok, problems, prompt_len)
  rollouts = sampler.sample(
      graphdef, params, jnp.asarray(prompts), jnp.asarray(mask), rng, n=n,
      max_new_tokens=sampling.max_new_tokens,
      temperature=float(sampling.temperature if temperature is None else temperature),
      top_k=int(sampling.top_k), top_p=float(sampling.top_p), eos_id=tok.eos_id,
      pad_id=tok.pad_id)
  rollouts = jax.tree.map(sharding.to_host, rollouts)
  completions = [tok.decode(row) for row in rollouts.tokens]
  rewards = np.array([reward_fn(text, problems[i // n]) for i, text in enumerate(completions)],
                     np.float32).reshape(len(problems), n)
  return ScoredRollouts(prompts, mask, rollouts, rewards, completions)


def sequences(scored: ScoredRollouts, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Prompt + response tokens [B, P + T] and their real-token mask, for scoring."""
  prompts = np.repeat(scored.prompts_GP, n, axis=0)
  prompt_mask = np.repeat(scored.prompt_mask_GP, n, axis=0)
  tokens = np.concatenate([prompts, scored.rollouts.tokens], axis=1)
  mask = np.concatenate([prompt_mask, scored.rollouts.mask], axis=1)
  return tokens, mask
