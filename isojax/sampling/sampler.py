"""Jitted batched sampling of n rollouts per problem with a shared prompt cache.

Each of the G prompts is prefilled once; its keys/values stay at [G, P] and every one
of its n rollouts attends to them (`decode.decode_step`), while each rollout keeps its
own [B, T] cache for generated tokens (B = G * n). Decoding runs in a
`lax.while_loop` that stops as soon as every rollout has emitted one of the stop ids
(every end-of-sequence id of the checkpoint, e.g. Llama 3 Instruct's `<|eot_id|>` and
`<|end_of_text|>`, plus any configured extra ids). A rollout that reaches
`max_new_tokens` without one is *truncated* (`Rollouts.finished` is False).

Under a mesh (`jax.set_mesh`), prompts, caches, logits and outputs are split over the
data-parallel axes (logical name `batch`): each device decodes only its own rollouts.
Random draws use JAX's partitionable Threefry, so a sharded call samples exactly what
one device would.

The policy is the tempered distribution softmax(logits / temperature); `logprobs` are
the log-probabilities of the chosen tokens under it (before top-k / top-p truncation,
which only restricts where samples may land), matching what the trainer recomputes.
Temperature 0 means greedy decoding, with log-probs of the untempered distribution.

This module is the sampler's front: the jitted functions of (graphdef, state, ...,
spec) that callers use, and the model a call decodes with. The parts, one subject
each: `spec` (`SampleSpec`, `Rollouts`), `distributions` (the draws), `lockstep` and
`continuous` (the two decoding schedules), `interruption` (forced interruptions),
`decode` (caches and the decode step).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from isojax.models import lora
from isojax.sampling import continuous, lockstep
from isojax.sampling import settings as sampling_settings
from isojax.sampling.interruption import Interruption
from isojax.sampling.lockstep import Decoding
from isojax.sampling.spec import Rollouts, SampleSpec, group_index

# What callers use, all importable from here (the parts define them).
__all__ = ["Decoding", "Interruption", "Rollouts", "SampleSpec", "advance", "cast_floats",
           "finish", "group_index", "sample", "start"]


def cast_floats(state, dtype: str | None):
  """`state` with its float arrays in `dtype` (None: as they are)."""
  if dtype is None:
    return state
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                      else x, state)


def _call_model(graphdef, state, spec: SampleSpec):
  """The model one call decodes with: LoRA adapters merged into their projections
  (`merge_adapters`: once per call, faster to decode than the adapters' own products,
  the same function), weights cast to `weights_dtype`, activations in `dtype`."""
  if spec.merge_adapters:
    model = nnx.merge(graphdef, state)
    if model.cfg.lora.enabled:
      graphdef, state = nnx.split(lora.merged_model(model))
  activations = spec.dtype or nnx.merge(graphdef, state).cfg.dtype
  weights = sampling_settings.cast_weights_dtype(spec.weights_dtype, activations)
  model = nnx.merge(graphdef, cast_floats(state, weights))
  return model.with_dtype(spec.dtype) if spec.dtype else model


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def sample(graphdef, state, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec,
           group_B=None) -> Rollouts:
  """Samples n rollouts for each of G left-padded prompts; rollout b belongs to b // n,
  or, with unequal groups, to prompt `group_B[b]` (`group_B` [B] int32 from
  `spec.group_index`: prompt g's rollouts side by side, at most `spec.n` of them, and
  each data-parallel shard's B / X rollouts of its own G / X prompts). Every rollout of
  a prompt reads that prompt's one cache either way.

  Any id of `stop_ids` ends a rollout (it is kept as the rollout's last token).
  `weights_dtype` ("bfloat16"; None: bfloat16 when the activations are,
  `settings.cast_weights_dtype`) casts the weights once for the whole call; `dtype`
  ("bfloat16") runs the call's activations, hence its prompt and decode caches, in that
  dtype (`Transformer.with_dtype`; None: the model's `cfg.dtype`). Logits and the
  sampler's log-probs are float32 either way.
  `num_slots` > 0 decodes with continuous batching in that many slots (see
  `continuous.sample`); 0 decodes all G * n rollouts in lockstep. `min_slots` > 0 lets
  continuous batching halve its slots, down to that many, once nothing is queued and at
  most half of them are busy (`continuous.slot_levels`); 0 keeps `num_slots` to the end.
  `decode_block` > 0 attends over the generated cache in blocks of that many tokens, only
  those holding tokens yet (`decode.decode_step`'s `cache_block`); the same samples.
  """
  model = _call_model(graphdef, state, spec)
  if spec.num_slots:
    return continuous.sample(model, prompts_GP, prompt_mask_GP, rng, spec, group_B)
  decoding = lockstep.start(model, prompts_GP, prompt_mask_GP, rng, spec, group_B)
  return lockstep.finish(lockstep.advance(model, decoding, spec), spec)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def start(graphdef, state, prompts_GP, prompt_mask_GP, rng, spec: SampleSpec) -> Decoding:
  """Prefills the prompts with `state`'s weights; no token is chosen yet (lockstep only)."""
  if spec.num_slots:
    raise ValueError("sampler.start/advance decode in lockstep: spec.num_slots must be 0")
  return lockstep.start(_call_model(graphdef, state, spec), prompts_GP, prompt_mask_GP, rng,
                        spec)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("decoding",))
def advance(graphdef, state, decoding: Decoding, until, spec: SampleSpec) -> Decoding:
  """Decodes with `state`'s weights until every row is done or `until` tokens are written.

  The cache of the tokens before keeps what earlier weights wrote (as in PipelineRL):
  switching weights between calls changes the policy from the next token on.
  """
  return lockstep.advance(_call_model(graphdef, state, spec), decoding, spec, until)


@functools.partial(jax.jit, static_argnames=("spec",))
def finish(decoding: Decoding, spec: SampleSpec) -> Rollouts:
  return lockstep.finish(decoding, spec)
