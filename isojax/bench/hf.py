"""Hugging Face's side of the benchmarks (imports torch and transformers)."""

from __future__ import annotations

import numpy as np
import torch
import transformers

from isojax.bench.ours import isojax_sample
from isojax.bench.options import Options
from isojax.bench.timing import random_prompts


def load(path: str):
  """The checkpoint at `path` as a `transformers` model on `device()`, in eval mode."""
  return transformers.AutoModelForCausalLM.from_pretrained(
      path, dtype=torch.float32).eval().to(device())


def device() -> str:
  """Where Hugging Face runs: the GPU when torch sees one (as JAX then does), else CPU."""
  return "cuda" if torch.cuda.is_available() else "cpu"


def hf_sample(hf_model, prompts_GP, *, n, new_tokens, do_sample=True) -> np.ndarray:
  """New tokens [G * n, T] of `generate` on the model's device; no EOS id, so every row
  has T of them (copied to the host, which waits for the device)."""
  torch.manual_seed(0)
  ids = torch.as_tensor(prompts_GP, dtype=torch.long, device=hf_model.device)
  # top_k=0 and top_p=1 switch off generate's default truncation, as isojax is called.
  policy = (dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0) if do_sample
            else dict(do_sample=False))
  with torch.inference_mode():
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                            num_return_sequences=n, eos_token_id=None, pad_token_id=0, **policy)
  new = out[:, ids.shape[1]:].cpu().numpy()
  if new.shape != (len(prompts_GP) * n, new_tokens):
    raise RuntimeError(f"generate returned new tokens {new.shape}, "
                       f"expected {(len(prompts_GP) * n, new_tokens)}")
  return new


def same_weights(model, hf_model, o: Options, rng, new_tokens: int = 16) -> bool:
  """Greedy continuations of one prompt agree between isojax and Hugging Face."""
  prompt = random_prompts(rng, 1, 8, o.vocab)
  ours = np.asarray(isojax_sample(model, prompt, n=1, new_tokens=new_tokens, temperature=0).tokens)
  return bool(np.array_equal(ours, hf_sample(hf_model, prompt, n=1, new_tokens=new_tokens,
                                             do_sample=False)))

