"""LoRA around a frozen base: which state trains, the base as reference, and exports.

With `model.lora.rank` > 0 each targeted projection of every layer gets an adapter
(`transformer.LoRA`: A [in, r], B [r, out] as `nnx.LoRAParam`s, stacked over layers
like the rest of the block). The policy's state then splits in two (`split`): the
adapters, which the update differentiates, the optimizer holds and the checkpoints
store; and the base, which loads from the checkpoint directory and never changes. The
reference policy of the KL term is the base itself: the same arrays with every B at
zero (`disabled`), not a second copy of the weights.

Written by hand rather than through qwix: qwix adds adapters by intercepting the
model's matmuls on a sample call, which a decoder whose layers are one stacked block
run by `lax.scan` does not survive (the adapters would be created inside the scan's
trace), and its adapters would not follow the activation dtype. Two small matrices
per projection are all LoRA is.

Exports: `merged_model` folds W + A @ B * alpha / r into a plain model (saved as a
Hugging Face checkpoint by `hf_checkpoint.save_model`); `save_peft` writes the adapters
alone in PEFT's layout (`adapter_config.json`, `adapter_model.safetensors`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from isojax.models import hf_layout, sharding
from isojax.models.transformer import ModelConfig, Transformer, abstract_model

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
_SUFFIX = "_lora"  # `q_proj_lora` is the adapter of `q_proj`


def split(params) -> tuple[Any, Any]:
  """(adapters, base) of a policy's state; (empty, params) without adapters."""
  return nnx.split_state(params, nnx.LoRAParam, ...)


def merge(adapters, base):
  """The policy's state from `split`'s two parts."""
  return nnx.merge_state(adapters, base)


def trained_and_frozen(params, *, enabled: bool) -> tuple[Any, Any]:
  """(what the update trains, what it holds frozen or None): with LoRA `enabled`, the
  adapters and the base (`split`); without, every parameter and None."""
  return split(params) if enabled else (params, None)


def whole(trained, frozen):
  """The policy's state from `trained_and_frozen`'s two parts."""
  return trained if frozen is None else merge(trained, frozen)


def as_model(graphdef, trained, frozen):
  """The module of `trained_and_frozen`'s two parts (inside a traced function)."""
  return nnx.merge(graphdef, trained) if frozen is None else nnx.merge(graphdef, trained,
                                                                       frozen)


def disabled(params):
  """The base model's state: `params` with zero adapters. The base arrays are the same
  arrays (no copy); the adapters are new zeros, so the update, which donates the
  trained adapters, leaves this state whole."""
  adapters, base = split(params)
  return merge(jax.tree.map(jnp.zeros_like, adapters), base)


def init_adapters(cfg: ModelConfig, mesh, seed: int = 0):
  """The adapters of a model of `cfg` as `Transformer(cfg, rngs=nnx.Rngs(seed))` draws
  them, placed on `mesh`. Only they are computed: XLA drops the unused base weights."""
  def make():
    return nnx.state(Transformer(cfg, rngs=nnx.Rngs(seed)), nnx.LoRAParam)
  abstract = nnx.state(abstract_model(cfg), nnx.LoRAParam)
  return jax.jit(make, out_shardings=sharding.state_shardings(abstract, mesh))()


def merged_model(model: Transformer) -> Transformer:
  """A model without adapters whose projections are W + A @ B * alpha / rank."""
  cfg = dataclasses.replace(model.cfg, lora=dataclasses.replace(model.cfg.lora, rank=0))
  adapters, base = split(nnx.state(model))
  flat_base = dict(nnx.to_flat_state(base))
  scale = model.cfg.lora.alpha / model.cfg.lora.rank
  pairs = {}
  for path, var in nnx.to_flat_state(adapters):
    pairs.setdefault(path[:-1], {})[path[-1]] = var[...]
  for adapter_path, ab in pairs.items():
    kernel = (*adapter_path[:-1], adapter_path[-1].removesuffix(_SUFFIX), "kernel")
    delta = jnp.einsum("...ir,...ro->...io", ab["a"], ab["b"]) * scale  # [L, in, out]
    flat_base[kernel] = flat_base[kernel].replace(flat_base[kernel][...] + delta)
  plain_graphdef, _ = nnx.split(abstract_model(cfg))  # outside any mesh (it may run in one)
  return nnx.merge(plain_graphdef, nnx.from_flat_state(list(flat_base.items())))


def peft_tensors(model: Transformer) -> dict[str, np.ndarray]:
  """The adapters as PEFT names them: `base_model.model.<module>.lora_A.weight` [r, in]
  and `.lora_B.weight` [out, r] per layer (torch Linear layouts of A and B)."""
  out = {}
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
    kernel = (*path[:-2], path[-2].removesuffix(_SUFFIX), "kernel")
    value = np.asarray(jax.device_get(var[...]), np.float32)  # [L, in, r] or [L, r, out]
    for layer, matrix in enumerate(value):
      module = hf_layout.hf_name(kernel, layer)[0].removesuffix(".weight")
      which = "lora_A" if path[-1] == "a" else "lora_B"
      out[f"base_model.model.{module}.{which}.weight"] = np.ascontiguousarray(matrix.T)
  return out


def save_peft(model: Transformer, path: str, *, base_model_name_or_path: str = "") -> None:
  """Writes the adapters as a PEFT LoRA adapter directory (`PeftModel.from_pretrained`)."""
  lora = model.cfg.lora
  os.makedirs(path, exist_ok=True)
  config = dict(peft_type="LORA", task_type="CAUSAL_LM",
                base_model_name_or_path=base_model_name_or_path, r=lora.rank,
                lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                target_modules=list(lora.targets), bias="none", fan_in_fan_out=False,
                use_rslora=False, inference_mode=True, modules_to_save=None)
  with open(os.path.join(path, PEFT_CONFIG), "w") as f:
    json.dump(config, f, indent=2)
  save_file(peft_tensors(model), os.path.join(path, PEFT_WEIGHTS), metadata={"format": "pt"})
