"""A run's trained policy, restored from its checkpoint over its base model.

`launch.export` writes it as a Hugging Face checkpoint or as PEFT adapters; a notebook
can evaluate or sample it directly.
"""

from __future__ import annotations

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from isojax import config_lib, run_dir
from isojax.models import hf_checkpoint, lora
from isojax.tasks import demo_bases


def restored_policy(workdir: str, step: int | None = None):
  """(model, base checkpoint path, step): the run's policy with checkpoint `step`'s
  parameters (the adapters of a LoRA run, over its base)."""
  config = config_lib.resolve(ml_collections.ConfigDict(run_dir.read_config(workdir)))
  path = demo_bases.policy_path(config)
  model = hf_checkpoint.load_model(path, **config.model)
  graphdef, params = nnx.split(model)
  trained, base = lora.split(params) if config.model.lora.rank else (params, None)
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(workdir))
  steps = ckpt.all_steps()
  if not steps or (step is not None and step not in steps):
    ckpt.close()
    raise ValueError(f"--workdir={workdir}: no checkpoint "
                     f"{'at all' if not steps else f'at step {step} (has {sorted(steps)})'}")
  step = max(steps) if step is None else step
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, trained)
  restored = ckpt.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract))).params
  ckpt.close()
  params = restored if base is None else lora.merge(restored, base)
  return nnx.merge(graphdef, params), path, step
