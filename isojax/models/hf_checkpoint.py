"""Loads and saves Hugging Face checkpoint directories (Llama 3, Qwen2.5, Qwen3).

A checkpoint directory holds `config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and `tokenizer.json`. The tiny base model that isojax
builds for CPU demos is written in the same layout and read back through the same
`load_model`, so the path that loads a 7B checkpoint on a pod is the path every test
and demo exercises.

Loading is streaming: each device reads its own block of each tensor from
safetensors, transposed to the Flax layout (and stacked over layers, our layout for
the scanned decoder), so the host never holds the whole model.

A GGUF file (or a directory holding one) is read the same way through
`gguf_checkpoint`: its metadata stands for config.json, its tensors are dequantized
under their Hugging Face names.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from isojax.models import checkpoint_files, gguf_checkpoint
from isojax.models import lora as lora_lib
from isojax.models import sharding as sharding_lib
from isojax.models.hf_layout import hf_name, hf_names, is_stacked
from isojax.models.settings import LoraSettings
from isojax.models.transformer import ModelConfig, Transformer, abstract_model

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")
WEIGHTS_FILE = checkpoint_files.WEIGHTS_FILE
WEIGHTS_INDEX = checkpoint_files.WEIGHTS_INDEX

# The checkpoint's own weights: every parameter but LoRA adapters (a subclass of Param).
_BASE = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))


def model_config_from_hf(hf: dict[str, Any], *, dtype: str = "float32",
                         fp32_lm_head: bool = True, lm_head_precision: str = "auto",
                         remat: str = "none", attention_chunk: int = 0,
                         attention_impl: str = "xla", lora: Any = None,
                         source: str = "config.json") -> ModelConfig:
  """The architecture of a config.json plus the compute options of `config.model`."""
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"{source}: model_type={model_type!r}; supported: {SUPPORTED_MODEL_TYPES}")
  if model_type in ("llama", "qwen3") and hf.get("attention_bias", False):
    raise ValueError(f"{source}: attention_bias=true ({model_type} output-projection bias) "
                     "is not supported")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"{source}: hidden_act={hf['hidden_act']!r}; only 'silu' (SwiGLU)")
  heads = hf["num_attention_heads"]
  return ModelConfig(
      vocab_size=hf["vocab_size"],
      num_layers=hf["num_hidden_layers"],
      embed_dim=hf["hidden_size"],
      num_heads=heads,
      num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
      mlp_dim=hf["intermediate_size"],
      rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get(
          "rope_theta", 10000.0))),
      rope_scaling=_rope_scaling(hf),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      qkv_bias=model_type == "qwen2",
      qk_norm=model_type == "qwen3",
      tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      dtype=dtype,
      fp32_lm_head=fp32_lm_head,
      lm_head_precision=lm_head_precision,
      remat=remat,
      attention_chunk=attention_chunk,
      attention_impl=attention_impl,
      lora=LoraSettings() if lora is None else LoraSettings.from_config(lora),
  )


def _rope_scaling(hf: dict[str, Any]) -> dict | None:
  scaling = hf.get("rope_scaling") or hf.get("rope_parameters")
  if not scaling or scaling.get("rope_type", scaling.get("type", "default")) == "default":
    return None
  return {k: v for k, v in scaling.items() if k != "rope_theta"}


def hf_config_from_model_config(cfg: ModelConfig, *, eos_token_id: int, bos_token_id: int,
                                pad_token_id: int) -> dict[str, Any]:
  """A config.json that transformers reads as Qwen2 (qkv bias), Qwen3 (q/k norm) or Llama."""
  model_type = "qwen3" if cfg.qk_norm else "qwen2" if cfg.qkv_bias else "llama"
  arch = {"qwen3": "Qwen3ForCausalLM", "qwen2": "Qwen2ForCausalLM",
          "llama": "LlamaForCausalLM"}[model_type]
  hf = dict(
      model_type=model_type, architectures=[arch], vocab_size=cfg.vocab_size,
      num_hidden_layers=cfg.num_layers, hidden_size=cfg.embed_dim,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
      head_dim=cfg.head_dim, intermediate_size=cfg.mlp_dim, rope_theta=cfg.rope_theta,
      rope_parameters=dict(rope_theta=cfg.rope_theta, rope_type="default"),
      rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_embeddings,
      hidden_act="silu", attention_bias=False, max_position_embeddings=4096,
      eos_token_id=eos_token_id, bos_token_id=bos_token_id, pad_token_id=pad_token_id,
      torch_dtype="float32")
  if cfg.rope_scaling:
    hf["rope_scaling"] = dict(cfg.rope_scaling)
    hf["rope_parameters"] = dict(cfg.rope_scaling, rope_theta=cfg.rope_theta)
  return hf


class _Tensors:
  """The tensors of a (sharded) safetensors checkpoint: their headers, checked against
  the files' sizes on opening; each file memory-mapped when a tensor of it is read."""

  def __init__(self, path: str):
    self._infos = checkpoint_files.tensor_headers(path)
    self._maps: dict[str, np.memmap] = {}

  def names(self) -> list[str]:
    return list(self._infos)

  def file_of(self, name: str) -> str:
    return self._infos[name].file

  def release(self) -> None:
    """Nothing to drop: blocks are read from the memory map as asked."""

  def shape(self, name: str) -> tuple[int, ...]:
    return self._infos[name].shape

  def _tensor(self, name: str) -> np.ndarray:
    info = self._infos[name]
    if info.file not in self._maps:
      self._maps[info.file] = np.memmap(info.file, dtype=np.uint8, mode="r")
    data = self._maps[info.file][info.offset:info.offset + info.nbytes]
    return data.view(checkpoint_files.DTYPES[info.dtype]).reshape(info.shape)

  def read(self, name: str, index: tuple[slice, ...], transpose: bool) -> np.ndarray:
    """`tensor.T[index]` (or `tensor[index]`) as float32, reading only that block."""
    tensor = self._tensor(name).T if transpose else self._tensor(name)
    return np.asarray(tensor[tuple(index)], np.float32)


def read_hf_config(path: str) -> dict[str, Any]:
  """`path/config.json`, or the config a GGUF checkpoint's metadata describes."""
  gguf_file = gguf_checkpoint.find(path)
  if gguf_file is not None:
    return gguf_checkpoint.open_file(gguf_file).hf_config()
  file = os.path.join(path, "config.json")
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file}: missing; expected a Hugging Face checkpoint directory")
  return checkpoint_files.read_json_object(file, "a Hugging Face config.json (a JSON object)")


def config_source(path: str) -> str:
  """The file a checkpoint's architecture is read from, for error messages."""
  return gguf_checkpoint.find(path) or os.path.join(path, "config.json")


def open_tensors(path: str):
  """The tensor reader of checkpoint `path`: safetensors, or a GGUF file."""
  gguf_file = gguf_checkpoint.find(path)
  if gguf_file is not None:
    return gguf_checkpoint.GGUFTensors(gguf_checkpoint.open_file(gguf_file))
  return _Tensors(path)


def load_model(path: str, mesh=None, *, dtype: str = "float32", fp32_lm_head: bool = True,
               lm_head_precision: str = "auto", remat: str = "none", attention_chunk: int = 0,
               attention_impl: str = "xla", lora: Any = None) -> Transformer:
  """Builds the model described by `path/config.json` (or a GGUF file) on `mesh`.

  Every device reads only its own block of each tensor straight from safetensors
  (`jax.make_array_from_callback`), so the host never holds a whole stacked
  parameter, let alone the model. With `lora` (`config.model.lora`, rank > 0) the
  adapters start fresh (B = 0: the loaded model's outputs, unchanged).
  """
  cfg = model_config_from_hf(read_hf_config(path), dtype=dtype, fp32_lm_head=fp32_lm_head,
                             lm_head_precision=lm_head_precision, remat=remat,
                             attention_chunk=attention_chunk,
                             attention_impl=attention_impl, lora=lora,
                             source=config_source(path))
  mesh = mesh or sharding_lib.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  graphdef, abstract_state = _abstract_base(cfg)
  flat_abstract = dict(nnx.to_flat_state(abstract_state))
  flat_shardings = dict(nnx.to_flat_state(sharding_lib.state_shardings(abstract_state, mesh)))
  tensors = open_tensors(path)
  _check_tensors(path, tensors, flat_abstract, cfg)
  for key, var in flat_abstract.items():
    sharding = flat_shardings[key]
    sharding = sharding.get_value() if hasattr(sharding, "get_value") else sharding
    flat_abstract[key] = var.replace(jax.make_array_from_callback(
        var.shape, sharding, functools.partial(_read_block, tensors, key, cfg.num_layers)))
    tensors.release()  # a GGUF's dequantized tensors of this parameter
  base = nnx.from_flat_state(flat_abstract)
  if not cfg.lora.enabled:
    return nnx.merge(graphdef, base)
  return nnx.merge(graphdef, lora_lib.init_adapters(cfg, mesh), base)


def check_files(path: str, *, dtype: str = "float32", fp32_lm_head: bool = True,
                lm_head_precision: str = "auto", remat: str = "none",
                attention_chunk: int = 0, attention_impl: str = "xla",
                lora: Any = None) -> None:
  """Checks checkpoint `path` as `load_model` would load it, reading no weights.

  config.json parses and describes a supported model; every safetensors file's header
  is whole and agrees with the file's size (`checkpoint_files`), or the GGUF file's
  tensors lie inside it; every tensor the model needs is there with its shape. Raises
  naming the file and tensor. A run calls it before it locks or writes its workdir.
  """
  cfg = model_config_from_hf(read_hf_config(path), dtype=dtype, fp32_lm_head=fp32_lm_head,
                             lm_head_precision=lm_head_precision, remat=remat,
                             attention_chunk=attention_chunk,
                             attention_impl=attention_impl, lora=lora,
                             source=config_source(path))
  _check_tensors(path, open_tensors(path), dict(nnx.to_flat_state(_abstract_base(cfg)[1])),
                 cfg)


def _abstract_base(cfg: ModelConfig):
  """(graphdef, abstract state) of the checkpoint's own parameters (no LoRA adapters)."""
  graphdef, abstract_state = nnx.split(abstract_model(cfg))
  _, abstract_state = lora_lib.split(abstract_state)  # the base: from the checkpoint
  return graphdef, abstract_state


def _check_tensors(path: str, tensors, flat_abstract: dict, cfg: ModelConfig) -> None:
  """Every parameter's tensors exist with the right shapes; no tensor is left over."""
  expected = {}
  for key, var in flat_abstract.items():
    transpose = hf_name(key, 0 if is_stacked(key) else None)[1]
    shape = var.shape[1:] if is_stacked(key) else var.shape
    for name in hf_names(key, cfg.num_layers):
      expected[name] = shape[::-1] if transpose else shape
  for name in tensors.names():
    if name not in expected:
      if "rotary_emb" in name or (name == "lm_head.weight" and cfg.tie_embeddings):
        continue  # cached RoPE tables; a tied head some checkpoints still store
      raise ValueError(f"{tensors.file_of(name)}: tensor {name!r} has no place in the model "
                       f"of {config_source(path)}")
    if tensors.shape(name) != tuple(expected[name]):
      raise ValueError(f"{tensors.file_of(name)}: tensor {name!r} has shape "
                       f"{tensors.shape(name)}, expected {tuple(expected[name])} (from "
                       f"{config_source(path)})")
  missing = sorted(set(expected) - set(tensors.names()))
  if missing:
    raise ValueError(f"{path}: checkpoint lacks tensors {missing[:5]}"
                     f"{' ...' if len(missing) > 5 else ''}")


def _read_block(tensors, key: tuple, num_layers: int,
                index: tuple[slice, ...]) -> np.ndarray:
  """The block `index` of parameter `key`, read from its Hugging Face tensor(s)."""
  if not is_stacked(key):
    name, transpose = hf_name(key)
    return tensors.read(name, index, transpose)
  blocks = []
  for layer in range(num_layers)[index[0]]:
    name, transpose = hf_name(key, layer)
    blocks.append(tensors.read(name, index[1:], transpose))
  return np.stack(blocks)


def _hf_tensors(model: Transformer) -> dict[str, np.ndarray]:
  out = {}
  for key, var in nnx.to_flat_state(nnx.state(model, _BASE)):
    value = np.asarray(jax.device_get(var[...]), np.float32)
    per_layer = list(value) if is_stacked(key) else [value]
    for layer, tensor in enumerate(per_layer):
      name, transpose = hf_name(key, layer if is_stacked(key) else None)
      out[name] = np.ascontiguousarray(tensor.T if transpose else tensor)
  return out


def save_model(model: Transformer, path: str, *, eos_token_id: int, bos_token_id: int,
               pad_token_id: int) -> None:
  """Writes config.json and model.safetensors (tokenizer files are the caller's)."""
  if model.cfg.lora.enabled:
    raise ValueError("the model has LoRA adapters, which a Hugging Face checkpoint cannot "
                     "hold: save lora.merged_model(model), or the adapters alone with "
                     "lora.save_peft")
  os.makedirs(path, exist_ok=True)
  hf = hf_config_from_model_config(model.cfg, eos_token_id=eos_token_id,
                                   bos_token_id=bos_token_id, pad_token_id=pad_token_id)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(hf, f, indent=2)
  save_file(_hf_tensors(model), os.path.join(path, WEIGHTS_FILE), metadata={"format": "pt"})
