"""Per-token log-probs and entropy of response tokens, without [B, T, V] logits.

At paper scale the logits of a rollout batch dwarf everything else the update holds:
they are V / D times the final hidden states (about 40 for Qwen2.5-7B), in float32,
for every response position. So the LM head runs over the response in sequence chunks
of C positions: each chunk's hidden states [B, C, D] become logits [B, C, V], are
reduced at once to the token log-prob (logit[token] - logsumexp) and, if asked, the
entropy, and are dropped. The chunk body is wrapped in `jax.checkpoint`, so the
backward pass recomputes one chunk's logits at a time instead of storing them all;
the peak is then one chunk's [B, C, V] whatever T is (the approach of tunix's
`rl/common.py`).

The distribution is the tempered policy softmax(logits / temperature), the one the
sampler draws from. chunk_size = 0 (or >= T) is the unchunked computation.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from isojax.rl import losses


def token_logp_entropy(head: Callable[[jax.Array], jax.Array], hidden_BTD: jax.Array,
                       targets_BT: jax.Array, *, temperature: float, chunk_size: int = 0,
                       need_entropy: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """(log-probs [B, T], entropy [B, T] or None) of `targets_BT` under softmax(head / temp).

  `head` maps final hidden states [B, C, D] to logits [B, C, V] (`Transformer.logits`);
  it must act on each position independently, which is what makes chunking exact.
  """

  def chunk(h_BCD, y_BC):
    logits_BCV = head(h_BCD).astype(jnp.float32) / temperature
    lse_BC = jax.nn.logsumexp(logits_BCV, axis=-1)
    logp_BC = jnp.take_along_axis(logits_BCV, y_BC[..., None], axis=-1)[..., 0] - lse_BC
    return logp_BC, losses.token_entropy(logits_BCV) if need_entropy else None

  b, t, d = hidden_BTD.shape
  if not chunk_size or chunk_size >= t:
    return chunk(hidden_BTD, targets_BT)
  j = -(-t // chunk_size)
  pad = j * chunk_size - t
  # Zero padding: a zero hidden state gives finite logits, and its rows are cut off below.
  h_BTD = jnp.pad(hidden_BTD, ((0, 0), (0, pad), (0, 0)))
  y_BT = jnp.pad(targets_BT, ((0, 0), (0, pad)))
  h_JBCD = h_BTD.reshape(b, j, chunk_size, d).swapaxes(0, 1)
  y_JBC = y_BT.reshape(b, j, chunk_size).swapaxes(0, 1)
  logp_JBC, entropy_JBC = jax.lax.map(jax.checkpoint(lambda xs: chunk(*xs)), (h_JBCD, y_JBC))

  def unchunk(x_JBC):
    return x_JBC.swapaxes(0, 1).reshape(b, j * chunk_size)[:, :t]

  return unchunk(logp_JBC), None if entropy_JBC is None else unchunk(entropy_JBC)


def response_logp(model, tokens_BS: jax.Array, mask_BS: jax.Array, *, prompt_len: int,
                  temperature: float, chunk_size: int = 0, need_entropy: bool = False,
                  ) -> tuple[jax.Array, jax.Array | None]:
  """(log-probs [B, T], entropy [B, T] or None) of the response tokens of S = P + T
  sequences: position P - 1 + t predicts response token t."""
  hidden_BSD = model.hidden_states(tokens_BS, mask_BS)
  return token_logp_entropy(model.logits, hidden_BSD[:, prompt_len - 1:-1],
                            tokens_BS[:, prompt_len:], temperature=temperature,
                            chunk_size=chunk_size, need_entropy=need_entropy)
