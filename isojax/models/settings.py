"""The run-time settings of the model (`config.model`): typed, validated, JAX-free.

The architecture comes from the checkpoint (`hf_checkpoint`); these fields say how it
runs. `transformer.ModelConfig` carries them and validates them here, so the config
layer (`config_lib.resolve`) and a model built by hand obey one rule.
"""

from __future__ import annotations

import dataclasses

from isojax import validation

# `jax.checkpoint_policies` names `model.remat` may take besides none and full.
REMAT_POLICIES = ("everything_saveable", "nothing_saveable", "dots_saveable",
                  "checkpoint_dots", "dots_with_no_batch_dims_saveable",
                  "checkpoint_dots_with_no_batch_dims")
REMAT_CHOICES = ("none", "full") + REMAT_POLICIES
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class ModelSettings(validation.Section):
  """`config.model`; the defaults and what each field means are in
  `config_lib.base_config`, the one place they are defined."""
  dtype: str
  fp32_lm_head: bool
  remat: str
  attention_chunk: int

  def __post_init__(self):
    validation.choice("model.dtype", self.dtype, DTYPES)
    validation.boolean("model.fp32_lm_head", self.fp32_lm_head)
    validation.choice("model.remat", self.remat, REMAT_CHOICES)
    validation.non_negative_int("model.attention_chunk", self.attention_chunk,
                                "0: all queries at once")


@dataclasses.dataclass(frozen=True)
class MeshSettings(validation.Section):
  """`config.mesh`: the learner's (data, fsdp, tensor) axis sizes, checked against the
  devices by `sharding.mesh_shape`, and the share of devices that only sample."""
  data: int
  fsdp: int
  tensor: int
  rollout_fraction: float

  def __post_init__(self):
    if isinstance(self.rollout_fraction, bool) or not 0 <= self.rollout_fraction < 1:
      raise ValueError(f"mesh.rollout_fraction={self.rollout_fraction!r}: expected in [0, 1) "
                       "(0: sampling shares the learner's devices)")
