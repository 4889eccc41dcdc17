"""The model's settings (`config.base_model`, `config.model`, `config.mesh`): typed,
validated, JAX-free, each field with its default and meaning (`validation.field`).

The architecture comes from the checkpoint (`hf_checkpoint`); these fields say how it
runs. `transformer.ModelConfig` carries them and validates them here, so a run's
settings (`run_settings.RunSettings`) and a model built by hand obey one rule.
"""

from __future__ import annotations

import dataclasses

from isojax import validation

F = validation.field

# `jax.checkpoint_policies` names `model.remat` may take besides none and full.
REMAT_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
                  "checkpoint_dots", "dots_with_no_batch_dims_saveable",
                  "checkpoint_dots_with_no_batch_dims")
REMAT_CHOICES = ("none", "full") + REMAT_POLICIES
DTYPES = ("float32", "bfloat16")
# How the float32 LM head multiplies bfloat16 activations by float32 weights
# (`lm_head.head_matmul`).
HEAD_PRECISIONS = ("auto", "highest", "bf16x2")
# Which kernel `jax.nn.dot_product_attention` runs for training and prefill.
ATTENTION_IMPLS = ("xla", "cudnn", "auto")
# The projections `model.lora.targets` may name (Hugging Face's module names).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSettings(validation.Section):
  """`config.model.lora`: low-rank adapters on the named projections (rank 0: none).

  Hashable (a tuple of targets): it is part of `ModelConfig`, hence of the graphdef.
  """
  rank: int = F(0, "LoRA adapters of this rank beside the target projections; 0 = none: "
                 "every weight trains ([models.md](models.md#lora-modellora))")
  alpha: float = F(16.0, "the adapters' output is scaled by alpha / rank")
  targets: tuple[str, ...] = F(LORA_TARGETS, "which of `q_proj`, `k_proj`, `v_proj`, "
                               "`o_proj`, `gate_proj`, `up_proj`, `down_proj` get adapters",
                               shown="all seven")
  dropout: float = F(0.0, "only 0: dropout would make the trainer's log-probs differ from "
                     "the sampler's")

  def __post_init__(self):
    validation.non_negative_int("model.lora.rank", self.rank, "0: no adapters")
    if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not (
        self.alpha > 0):
      raise ValueError(f"model.lora.alpha={self.alpha!r}: expected a positive number (the "
                       "adapters' output is scaled by alpha / rank)")
    targets = tuple(self.targets) if isinstance(self.targets, (list, tuple)) else None
    if targets is None or (self.rank and not targets):
      raise ValueError(f"model.lora.targets={self.targets!r}: expected a non-empty list of "
                       f"{list(LORA_TARGETS)}")
    unknown = [t for t in targets if t not in LORA_TARGETS]
    if unknown:
      raise ValueError(f"model.lora.targets: {unknown} name no layer; expected some of "
                       f"{list(LORA_TARGETS)}")
    object.__setattr__(self, "targets", targets)
    if self.dropout != 0:
      raise ValueError(f"model.lora.dropout={self.dropout!r}: only 0 is supported (dropout "
                       "would make the trainer's log-probs differ from the sampler's, "
                       "which every ratio of the RL losses compares)")

  @property
  def enabled(self) -> bool:
    return self.rank > 0

  @classmethod
  def from_config(cls, section) -> "LoraSettings":
    if isinstance(section, LoraSettings):
      return section
    return validation.from_mapping(cls, section)


@dataclasses.dataclass(frozen=True)
class BaseModelSettings(validation.Section):
  """`config.base_model`: the policy's starting checkpoint ([models.md](models.md))."""
  path: str = F("", "Hugging Face checkpoint directory or GGUF file; `\"\"` = the shipped "
                "demo base model of `task.name`")


@dataclasses.dataclass(frozen=True)
class ModelSettings(validation.Section):
  """`config.model`: how the checkpoint's architecture runs ([models.md](models.md))."""
  dtype: str = F("float32", "activation dtype, `float32` or `bfloat16`; parameters stay "
                 "float32")
  fp32_lm_head: bool = F(True, "logits from float32 products")
  lm_head_precision: str = F("auto", "with `fp32_lm_head`, bfloat16 activations and float32 "
                             "weights: `highest` (float32 products), `bf16x2` (the weights as "
                             "two bfloat16 parts, exact to 2^-17 of each), `auto` (bf16x2 on "
                             "GPUs, highest elsewhere)")
  remat: str = F("none", "what the backward pass recomputes: `none`, `full`, or a "
                 "`models.settings.REMAT_POLICIES` name")
  attention_chunk: int = F(0, "queries per attention block (scores [B, N, chunk, S]); "
                           "0 = all")
  attention_impl: str = F("xla", "training and prefill attention: `xla` (einsum and "
                          "softmax), `cudnn` (cuDNN's fused kernel; GPUs, bfloat16) or "
                          "`auto` (cudnn where it runs, xla elsewhere; the paper preset's)")
  lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)

  def __post_init__(self):
    object.__setattr__(self, "lora", LoraSettings.from_config(self.lora))
    validation.choice("model.dtype", self.dtype, DTYPES)
    validation.boolean("model.fp32_lm_head", self.fp32_lm_head)
    validation.choice("model.lm_head_precision", self.lm_head_precision, HEAD_PRECISIONS)
    validation.choice("model.remat", self.remat, REMAT_CHOICES)
    validation.choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
    if self.attention_impl == "cudnn" and self.dtype != "bfloat16":
      raise ValueError(f"model.attention_impl='cudnn' with model.dtype={self.dtype!r}: "
                       "cuDNN's fused attention takes bfloat16; expected model.dtype="
                       "'bfloat16' or model.attention_impl='xla'")
    validation.non_negative_int("model.attention_chunk", self.attention_chunk,
                                "0: all queries at once")


@dataclasses.dataclass(frozen=True)
class MeshSettings(validation.Section):
  """`config.mesh`: the learner's (data, fsdp, tensor) axis sizes, checked against the
  devices by `sharding.mesh_shape`, and the share of devices that only sample
  ([models.md](models.md#sharding))."""
  data: int = F(-1, "data-parallel axis size; one axis at -1 takes the devices left over")
  fsdp: int = F(1, "FSDP axis size (parameters and optimizer state sharded)")
  tensor: int = F(1, "tensor-parallel axis size")
  rollout_fraction: float = F(
      0.0, "> 0 (with `rl.max_staleness` > 0): this share of the devices only samples, on "
      "its own data-parallel mesh; the axes above span the rest "
      "([rl_algorithms.md](rl_algorithms.md#off-policy-generation-rlmax_staleness))")

  def __post_init__(self):
    if isinstance(self.rollout_fraction, bool) or not 0 <= self.rollout_fraction < 1:
      raise ValueError(f"mesh.rollout_fraction={self.rollout_fraction!r}: expected in [0, 1) "
                       "(0: sampling shares the learner's devices)")


def attention_implementation(setting: str, *, dtype: str, head_dim: int, backend: str,
                             capability: str = "") -> str:
  """`model.attention_impl` as traced on `backend` (a GPU's compute `capability`, e.g.
  "9.0"): "auto" is cuDNN's fused kernel where it runs (a GPU of capability 8.0 or
  later, bfloat16 activations, head widths a multiple of 8 up to 128): on one H100 it
  took a 1.5B model's update from 2.63 to 2.38 s and its forward from 0.67 to 0.57 s
  (docs/results/gpu_update.md). Elsewhere, CPUs and TPUs included, XLA's einsum path."""
  if setting != "auto":
    return setting
  major = capability.split(".")[0]
  major = int(major) if major.isdigit() else 0  # not CUDA's "9.0" (ROCm's "gfx90a"): no
  fits = dtype == "bfloat16" and head_dim % 8 == 0 and head_dim <= 128
  return "cudnn" if backend == "gpu" and major >= 8 and fits else "xla"
