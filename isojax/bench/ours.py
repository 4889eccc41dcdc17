"""isojax's side of the benchmarks: a random-weight checkpoint, and sampling and
prefill calls that return only once computed."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from isojax.bench.options import Options
from isojax.models import hf_checkpoint
from isojax.models.transformer import ModelConfig, Transformer
from isojax.sampling import decode, sampler


def write_checkpoint(path: str, o: Options) -> None:
  """A random-weight Qwen2-shaped checkpoint (config.json, model.safetensors) at `path`,
  which isojax, `transformers` and Tunix all load."""
  cfg = ModelConfig(vocab_size=o.vocab, num_layers=o.layers, embed_dim=o.hidden,
                    num_heads=o.heads, num_kv_heads=o.kv_heads, head_dim=o.hidden // o.heads,
                    mlp_dim=o.intermediate, qkv_bias=True)
  hf_checkpoint.save_model(Transformer(cfg, rngs=nnx.Rngs(o.seed)), path, eos_token_id=0,
                           bos_token_id=0, pad_token_id=0)


def param_counts(model) -> dict[str, int]:
  """Parameters of the decoder body (layers, final norm), the LM head, the embedding."""
  _, state = model
  counts = dict(body=0, head=0, embed=0)
  for key, value in nnx.to_flat_state(state):
    part = "head" if key[0] == "lm_head" else "embed" if key[0] == "embed" else "body"
    counts[part] += int(np.prod(value[...].shape))
  return counts


def isojax_sample(model, prompts_GP, *, n, new_tokens, temperature=1.0, stop_ids=(),
                  num_slots=0, min_slots=0, decode_block=0, weights_dtype=None, dtype=None,
                  merge_adapters=True):
  """Rollouts of `sampler.sample` (B = G * n rows), computed before returning."""
  graphdef, state = model
  spec = sampler.SampleSpec(n=n, max_new_tokens=new_tokens, temperature=temperature,
                            stop_ids=tuple(stop_ids), pad_id=0, num_slots=num_slots,
                            min_slots=min_slots, decode_block=decode_block,
                            weights_dtype=weights_dtype, dtype=dtype,
                            merge_adapters=merge_adapters)
  return jax.block_until_ready(sampler.sample(
      graphdef, state, jnp.asarray(prompts_GP), jnp.ones(prompts_GP.shape, bool),
      jax.random.key(0), spec))


@functools.partial(jax.jit, static_argnums=0)
def _prefill(graphdef, state, prompts_GP):
  return decode.prefill(nnx.merge(graphdef, state), prompts_GP,
                        jnp.ones(prompts_GP.shape, bool))


def isojax_prefill(model, prompts_GP):
  """The prompts' prefill alone (`decode.prefill`, which `sampler.sample` starts
  with), computed before returning."""
  return jax.block_until_ready(_prefill(*model, jnp.asarray(prompts_GP)))

