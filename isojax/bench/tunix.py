"""Tunix's vanilla sampler on a Hugging Face Qwen2 checkpoint, for `launch.bench`.

`launch.bench` compares isojax's sampler with Hugging Face `generate` on one saved
checkpoint; this module adds Google's Tunix (`google-tunix`) on the same weights, so the
JAX-to-JAX comparison is there when Tunix is installed and costs nothing when it is not
(nothing here imports Tunix until `load`). How Tunix is driven, and why, as read in the
google-tunix 0.1.7 source:

  * Weights: `tunix.models.qwen2.params.create_model_from_safe_tensors` reads the same
    `model.safetensors` that isojax and `transformers` read; its `ModelConfig` is filled
    from `config.json` through `hf_checkpoint.model_config_from_hf`, the parser isojax
    itself uses, so the two cannot disagree on an architecture field. Float32, no mesh.
  * Sampler: `tunix.generate.sampler.Sampler` (the "vanilla" sampler), called the way
    Tunix's own RL rollout calls it (`rl/rollout/vanilla_rollout.py`): echo=False,
    pad_output=False, max_prompt_length=P (so no left padding), return_logprobs=False
    (the `RolloutConfig` default). Sampling is top-p mode with top_p=1, top_k=None,
    which Tunix runs as plain `jax.random.categorical` on logits / temperature; greedy
    is its greedy mode. The KV cache is P + T long, the least `Sampler` accepts.
  * Token ids, not text: `Sampler.__call__` takes strings and tokenizes each row in
    Python with `tokenizer.encode`. `_IdTokenizer` is a minimal tokenizer (the
    encode/decode/bos_id/eos_id/pad_id interface `TokenizerAdapter` accepts) whose
    `encode` returns a row of ids unchanged and whose `decode` returns "" (no text is
    produced on any side of the benchmark).
  * No EOS, no padding: eos and pad ids are -1, never sampled. The pad id must not be a
    real token: in decode Tunix masks out of attention every buffer token equal to the
    pad id, generated ones included, so pad 0 would change continuations that emit 0.
  * n rollouts per prompt: the vanilla sampler has no samples-per-prompt argument and
    no shared prompt cache; Tunix's GRPO repeats each prompt `num_generations` times
    before generating (`rl/rl_learner.py`, `np.repeat(x, sample_repeat, axis=0)`), and
    so does `sample`. Each rollout therefore prefills its own copy of the prompt.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import json
import os
from typing import Any

import flax
import numpy as np

from isojax.bench.ours import isojax_sample
from isojax.bench.options import Options
from isojax.bench import tunix_step
from isojax.bench.timing import random_prompts
from isojax.models import hf_checkpoint

NO_TOKEN = -1   # eos and pad id: outside the vocabulary, so never sampled


def tunix_available() -> bool:
  """Whether `google-tunix` can be imported (checked without importing it)."""
  return importlib.util.find_spec("tunix") is not None


def version() -> str:
  return importlib.metadata.version("google-tunix")


class _IdTokenizer:
  """Token ids in, token ids out: the interface `TokenizerAdapter` requires."""

  def encode(self, ids_P, **unused) -> list[int]:
    return [int(i) for i in ids_P]

  def decode(self, ids, **unused) -> str:
    return ""

  def bos_id(self):
    return None   # Sampler.tokenize prepends a BOS only when this is truthy

  def eos_id(self) -> int:
    return NO_TOKEN

  def pad_id(self) -> int:
    return NO_TOKEN


@dataclasses.dataclass
class Handle:
  """A Tunix Qwen2 model and one `Sampler` per KV-cache length (each keeps its own
  compiled prefill and decode functions, so timed calls reuse the warm-up's)."""
  model: Any
  config: Any   # tunix.models.qwen2.model.ModelConfig
  samplers: dict[int, Any] = dataclasses.field(default_factory=dict)


def tunix_config(path: str):
  """Tunix's Qwen2 `ModelConfig` for the checkpoint at `path`, float32."""
  from tunix.models.qwen2 import model as qwen2   # pylint: disable=g-import-not-at-top
  source = os.path.join(path, "config.json")
  with open(source) as f:
    hf = json.load(f)
  if hf.get("model_type") != "qwen2":
    raise ValueError(f"{source}: model_type={hf.get('model_type')!r}; the Tunix adapter "
                     "loads only 'qwen2' (Qwen2ForCausalLM)")
  cfg = hf_checkpoint.model_config_from_hf(hf, source=source)
  if cfg.rope_scaling:
    raise ValueError(f"{source}: rope_scaling={cfg.rope_scaling}; Tunix's Qwen2 has "
                     "only plain RoPE")
  return qwen2.ModelConfig(**tunix_step.model_config_fields(cfg),
                           use_tied_embedding=cfg.tie_embeddings)



def load(path: str) -> Handle:
  """Tunix's Qwen2 with the weights of the Hugging Face checkpoint at `path`."""
  # Importing Tunix's models turns flax's `always_shard_variable` off for the whole
  # process; keep that setting to Tunix's own model and restore it for isojax.
  with flax.config.temp_flip_flag("always_shard_variable", False):
    from tunix.models.qwen2 import params   # pylint: disable=g-import-not-at-top
    config = tunix_config(path)
    model = params.create_model_from_safe_tensors(path, config)
  return Handle(model=model, config=config)


def _sampler(handle: Handle, cache_size: int):
  if cache_size not in handle.samplers:
    from tunix.generate import sampler   # pylint: disable=g-import-not-at-top
    c = handle.config
    handle.samplers[cache_size] = sampler.Sampler(
        transformer=handle.model, tokenizer=_IdTokenizer(),
        cache_config=sampler.CacheConfig(cache_size=cache_size, num_layers=c.num_layers,
                                         num_kv_heads=c.num_kv_heads, head_dim=c.head_dim))
  return handle.samplers[cache_size]


def sample(handle: Handle, prompts_GP: np.ndarray, n: int, new_tokens: int, *,
           temperature: float = 1.0, seed: int = 0) -> np.ndarray:
  """New tokens [G * n, T] of Tunix's `Sampler`, the n rollouts of a prompt adjacent
  (as `generate`'s num_return_sequences orders them); temperature 0 is greedy."""
  g, p = prompts_GP.shape
  rows_BP = np.repeat(np.asarray(prompts_GP, np.int32), n, axis=0)
  out = _sampler(handle, p + new_tokens)(
      list(rows_BP), max_generation_steps=new_tokens, max_prompt_length=p, echo=False,
      temperature=temperature, top_p=1.0 if temperature > 0 else None, top_k=None,
      seed=seed, pad_output=False, eos_tokens=[NO_TOKEN])
  new_BT = np.stack([np.asarray(row) for row in out.tokens])   # host arrays: computed
  if new_BT.shape != (g * n, new_tokens):
    raise RuntimeError(f"Tunix's Sampler returned new tokens {new_BT.shape}, "
                       f"expected {(g * n, new_tokens)}")
  return new_BT


def greedy_matches(handle: Handle, prompt_P: np.ndarray, tokens_T: np.ndarray) -> bool:
  """Tunix's greedy continuation of one prompt [P] equals `tokens_T` (e.g. isojax's)."""
  tokens_T = np.asarray(tokens_T).reshape(-1)
  ours = sample(handle, np.asarray(prompt_P).reshape(1, -1), n=1, new_tokens=len(tokens_T),
                temperature=0.0)
  return bool(np.array_equal(ours[0], tokens_T))


def tunix_same_weights(model, tunix, o: Options, new_tokens: int = 16) -> bool | None:
  """Greedy continuations of one prompt agree between isojax and Tunix (None: no Tunix)."""
  if tunix is None:
    return None
  # Its own generator: the workloads' prompts do not depend on whether Tunix is installed.
  prompt = random_prompts(np.random.default_rng(o.seed + 1), 1, 8, o.vocab)
  ours = np.asarray(isojax_sample(model, prompt, n=1, new_tokens=new_tokens, temperature=0).tokens)
  return greedy_matches(tunix, prompt[0], ours[0])


def tunix_status() -> str:
  """Whether Tunix's sampler is measured (the figures are null when it is not)."""
  if not tunix_available():
    return "tunix: not installed, skipped"
  return (f"tunix: google-tunix {version()}, vanilla Sampler, each prompt "
          "repeated n times (no shared prompt cache)")

