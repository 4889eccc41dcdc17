r"""Builds a tiny demo base model: supervised training on the task of --config.

  python -m launch.build_base --config=configs/hard.py --out=/tmp/bases/arithmetic
  python -m launch.build_base --config=configs/reasoning.py --out=/tmp/bases/chain_sum
  python -m launch.build_base --config=configs/recall.py --out=/tmp/bases/recall
  python -m isojax.main --config=configs/hard.py --config.base_model.path=/tmp/bases/arithmetic

Writes a new directory in the Hugging Face layout (config.json, model.safetensors, the
tokenizer files) with `manifest.json`: the file hashes, architecture, tokenizer, these
build settings, the task settings the SFT data came from, the command line, and the
jax version, CPU and XLA flags it ran with. Any run loads it through
`--config.base_model.path`, which checks it against its manifest.

The models isojax ships (`isojax/assets/base_models/`) were written by this command;
their manifests carry the exact command. SFT is chaotic in float rounding, so the
same command on another CPU or jax version builds another model: that is why the
demos load the shipped files instead of building. The task fields come from --config
(its task.name picks the demo: arithmetic or reasoning_gym); the build settings from
the flags below, whose defaults are those of the shipped model of that task.
The recall task's base is constructed, not trained (`isojax.base_models.recall_base`): the
build flags do not apply to it, and it is the same on every machine.
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import dataclasses
import json
import shlex
import sys

from absl import app, flags
from ml_collections import config_flags

from isojax import command_line
from isojax.base_models import demo_bases
from isojax.base_models import recall_base
from isojax.base_models import tiny_base_model
from isojax.tasks.settings import TaskSettings

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/hard.py", "Run config whose task the model is built for "
    "(file.py[:preset]).", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "The new model directory (must not exist).",
                           required=True)
_NAME = flags.DEFINE_string("name", "", "The manifest's name (default: --out's basename).")
_SETTINGS = {
    f.name: (flags.DEFINE_float if f.type in (float, "float") else flags.DEFINE_integer)(
        f.name, None, f"Build setting {f.name} (default: the shipped model's).")
    for f in dataclasses.fields(tiny_base_model.BuildSettings)}


def shipped_settings(task_name: str) -> tiny_base_model.BuildSettings:
  """The build settings of the shipped model of `task_name` (the flags' defaults)."""
  manifest = demo_bases.read_manifest(demo_bases.shipped_dir(task_name))
  return tiny_base_model.BuildSettings(**manifest["build"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  task = TaskSettings.from_config(_CONFIG.value.task)  # the ConfigDict ends here
  command = shlex.join(["python", "-m", "launch.build_base", *sys.argv[1:]])
  if task.name == "recall":  # constructed from the task's settings, nothing to train
    try:
      manifest = recall_base.build(task, _OUT.value, name=_NAME.value, command=command)
    except (ValueError, FileExistsError) as e:
      raise SystemExit(f"launch.build_base: error: {e}") from None
    print(json.dumps({k: manifest[k] for k in ("name", "task", "build")}, indent=2))
    print(f"wrote {_OUT.value}")
    return
  try:
    defaults = shipped_settings(task.name)
  except (FileNotFoundError, ValueError):
    defaults = tiny_base_model.BuildSettings()
  settings = dataclasses.replace(
      defaults, **{k: v.value for k, v in _SETTINGS.items() if v.value is not None})
  try:
    settings.validate()
    manifest = tiny_base_model.build(
        settings, task, _OUT.value, name=_NAME.value, command=command)
  except (ValueError, FileExistsError) as e:
    raise SystemExit(f"launch.build_base: error: {e}") from None
  print(json.dumps({k: manifest[k] for k in ("name", "build", "built_with")}, indent=2))
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.parse_flags)
