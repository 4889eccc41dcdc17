"""A run's trained policy, restored from its checkpoint over its base model.

`launch.export` writes it as a Hugging Face checkpoint or as PEFT adapters; a notebook
can evaluate or sample it directly.
"""

from __future__ import annotations

import os
import shutil

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from isojax import run_dir
from isojax.base_models import demo_bases
from isojax.config import config_lib
from isojax.models import hf_checkpoint, lora
from isojax.run import resume_check

# What a checkpoint directory holds besides its weights (copied from the base).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "generation_config.json", "vocab.json",
                   "merges.txt")


def restored_policy(workdir: str, step: int | None = None):
  """(model, base checkpoint path, step): the run's policy with checkpoint `step`'s
  parameters (the adapters of a LoRA run, over its base)."""
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(workdir))
  steps = ckpt.all_steps()
  if not steps or (step is not None and step not in steps):
    ckpt.close()
    raise ValueError(f"--workdir={workdir}: no checkpoint "
                     f"{'at all' if not steps else f'at step {step} (has {sorted(steps)})'}")
  step = max(steps) if step is None else step
  # The settings of that step: config.json with the changes a resume was allowed.
  s = config_lib.settings(config_lib.resolve(ml_collections.ConfigDict(
      resume_check.config_at(workdir, step))))
  path = demo_bases.policy_path(s.base_model.path, s.task)
  model = hf_checkpoint.load_model(path, **s.model.as_kwargs())
  graphdef, params = nnx.split(model)
  trained, base = lora.trained_and_frozen(params, enabled=s.model.lora.enabled)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, trained)
  restored = ckpt.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(abstract))).params
  ckpt.close()
  params = lora.whole(restored, base)
  return nnx.merge(graphdef, params), path, step


def save_hf(model, base_path: str, out: str) -> None:
  """`model` as a Hugging Face checkpoint directory (LoRA adapters merged into the
  weights) with the base checkpoint's tokenizer files."""
  hf = hf_checkpoint.read_hf_config(base_path)
  plain = lora.merged_model(model) if model.cfg.lora.enabled else model
  hf_checkpoint.save_model(plain, out, eos_token_id=hf.get("eos_token_id"),
                           bos_token_id=hf.get("bos_token_id"),
                           pad_token_id=hf.get("pad_token_id"))
  for name in TOKENIZER_FILES:
    if os.path.isfile(os.path.join(base_path, name)):
      shutil.copyfile(os.path.join(base_path, name), os.path.join(out, name))
