"""Our parameter paths as Hugging Face tensor names: the one table both exports read.

`hf_checkpoint` loads and saves whole models under these names, and `lora` names the
adapters of a PEFT export after the projections they adapt; both depend on this module,
neither on the other's export.
"""

from __future__ import annotations

# Our module names -> Hugging Face module names (inside `model.layers.<i>.`).
_MODULE_NAMES = {"attn": "self_attn", "mlp": "mlp", "input_norm": "input_layernorm",
                 "post_attn_norm": "post_attention_layernorm"}
# Our leaf names -> (Hugging Face leaf name, whether the matrix is transposed):
# Flax kernels are [in, out], torch Linear weights are [out, in].
_LEAF_NAMES = {"kernel": ("weight", True), "bias": ("bias", False), "weight": ("weight", False)}


def hf_name(key: tuple, layer: int | None = None) -> tuple[str, bool]:
  """(Hugging Face tensor name, transposed?) of one of our parameter paths.

  Parameters under `layers` are stacked over the layer axis; `layer` picks the
  Hugging Face tensor of one layer (`model.layers.<layer>....`).
  """
  if key == ("embed", "embedding"):
    return "model.embed_tokens.weight", False
  if key == ("final_norm", "weight"):
    return "model.norm.weight", False
  if key == ("lm_head", "kernel"):
    return "lm_head.weight", True
  if key[0] == "layers" and layer is not None:
    _, module, *inner, leaf = key
    name, transpose = _LEAF_NAMES[leaf]
    return ".".join(["model.layers", str(layer), _MODULE_NAMES[module], *inner, name]), transpose
  raise ValueError(f"parameter {key} (layer {layer}) has no Hugging Face name")


def is_stacked(key: tuple) -> bool:
  """Whether the parameter is stacked over the layer axis (one tensor per layer in HF)."""
  return key[0] == "layers"


def hf_names(key: tuple, num_layers: int) -> list[str]:
  """Every Hugging Face tensor behind one parameter (one per layer when stacked)."""
  layers = range(num_layers) if is_stacked(key) else [None]
  return [hf_name(key, layer)[0] for layer in layers]
