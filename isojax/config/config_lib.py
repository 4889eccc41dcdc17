"""The command line's edge: configs as ml_collections ConfigDicts, the recipe table and
the presets.

The fields, their defaults and meanings and their checks are the typed settings'
(`isojax.config.run_settings.RunSettings` and the sections it holds); this module only maps
them to a ConfigDict and back. Config files under `configs/` start from
`base_config()`, apply a row of `RECIPES` and a preset, and return a ConfigDict.
`isojax.main` calls `resolve(config)` before any compilation: it rejects unknown fields
(naming the closest known one) and impossible allocations with errors that name the
field, and derives `num_steps` from `budget_rollouts` when only the budget is given.
`settings(config)` is the typed tree everything below the command line reads.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import ml_collections
from ml_collections import config_dict

from isojax import storage
from isojax.config import run_settings

# The IsoCompute paper's regularisation table: the easy recipe adds a KL anchor and an
# entropy bonus, the hard recipe neither. Entropy is never used without the KL anchor.
# Coefficients are the tiny-model values; the paper-scale presets keep the same switches.
RECIPES: dict[str, dict[str, Any]] = {
    "easy": dict(kl_coef=0.01, entropy_coef=0.001, zero_variance_filter="off"),
    "hard": dict(kl_coef=0.0, entropy_coef=0.0, zero_variance_filter="off"),
}


def base_config() -> ml_collections.ConfigDict:
  """Every field isojax knows, with the tiny-CPU defaults: `run_settings.RunSettings`'s
  fields, where each default and meaning is written."""
  return _config_dict(run_settings.RunSettings)


def _config_dict(cls) -> ml_collections.ConfigDict:
  """The defaults of the settings dataclass `cls` as a ConfigDict, sections nested; a
  None default becomes a placeholder of the field's `kind`, so the command line can
  still parse `--config.num_steps=20`."""
  c = ml_collections.ConfigDict()
  for f in dataclasses.fields(cls):
    if dataclasses.is_dataclass(f.default_factory):
      c[f.name] = _config_dict(f.default_factory)
      continue
    value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    if value is None:
      c[f.name] = config_dict.placeholder(f.metadata["kind"])
    elif isinstance(value, dict):
      c[f.name] = ml_collections.ConfigDict(value)
    else:
      c[f.name] = value
  return c


def apply_recipe(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  if name not in RECIPES:
    raise ValueError(f"recipe {name!r}: expected one of {sorted(RECIPES)}")
  config.rl.update(RECIPES[name])
  return config


def apply_preset(config: ml_collections.ConfigDict, name: str | None) -> ml_collections.ConfigDict:
  """Applies a size preset: default (laptop CPU), micro (smoke test), paper (7B)."""
  name = name or "default"
  if name == "default":
    return config
  if name == "micro":
    config.rollouts_per_problem = 4
    config.problems_per_batch = 4
    config.num_steps = 3
    config.task.num_train = 64
    config.task.num_val = 16
    config.eval.every = 2
    config.eval.train_problems = 16  # the histogram's path, at the validation set's size
    config.checkpoint_every = 2
    return config
  if name == "paper":
    # Qwen2.5-7B-Instruct on H200s, as in the IsoCompute paper; point base_model.path at
    # a local copy of the checkpoint. LR 1e-6 at B_ref = 1024, scaled by sqrt(B / B_ref).
    config.base_model.path = "/path/to/Qwen2.5-7B-Instruct"
    config.rollouts_per_problem = 64
    config.problems_per_batch = 256
    config.num_steps = 200
    config.model.dtype = "bfloat16"
    config.sampling.max_new_tokens = 8192
    config.optim.update(learning_rate=1e-6, lr_reference_batch=1024, warmup_steps=10,
                        weight_decay=0.0)
    config.eval.update(every=10, num_samples=4, k=4)
    config.mesh.update(data=1, fsdp=-1, tensor=1)
    # Memory (docs/paper_scale.md; checked by `python -m launch.aot`): 64 rollouts per
    # gradient micro-batch, the LM head 512 positions at a time, layers rematerialised,
    # queries attended 1,024 at a time, 4,096 rollouts per sampler call; decode reads
    # the generated cache 512 slots at a time, only as far as it is filled.
    config.rl.update(micro_batch_size=64, logprob_chunk_size=512)
    config.model.update(remat="full", attention_chunk=1024, attention_impl="auto")
    config.sampling.update(max_rollouts_per_call=4096, weights_dtype="bfloat16",
                           decode_block=512)
    config.rl.log_kl_to_base = config.rl.kl_coef > 0  # no second 7B copy unless needed
    config.checkpoint_every = 10
    return config
  raise ValueError(f"preset {name!r}: expected one of default, micro, paper")


def config_from_json(path: storage.PathLike) -> ml_collections.ConfigDict:
  """A config from a JSON file (local or gs://) of (a subset of) its fields over
  `base_config()`."""
  try:
    fields = storage.read_json(path)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"config file {e}") from e
  except ValueError as e:
    raise ValueError(f"config file {e}") from e
  return override(base_config(), fields, f"config file {path}")


def override(config: ml_collections.ConfigDict, fields: dict[str, Any],
             source: str) -> ml_collections.ConfigDict:
  """`config` with the nested `fields` set in place; a field the schema lacks is an
  error naming `source` and the closest known field."""
  extra = unknown_fields(fields, base_config().to_dict())
  if extra:
    raise ValueError(f"{source}: unknown field(s) {describe_unknown(extra)}")
  _merge(config, fields)
  return config


def _merge(config: ml_collections.ConfigDict, fields: dict[str, Any]) -> None:
  for key, value in fields.items():
    if isinstance(value, dict):
      _merge(config[key], value)
    else:
      config[key] = value


# Free-form dicts whose keys belong to another library (a reasoning-gym dataset's
# keyword arguments), checked by the task family instead of this schema.
FREE_FORM_FIELDS = ("task.dataset_kwargs",)


def unknown_fields(config: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> list[str]:
  """Dotted names in `config` that `schema` does not have."""
  unknown = []
  for key, value in config.items():
    name = f"{prefix}{key}"
    if key not in schema:
      unknown.append(name)
    elif name in FREE_FORM_FIELDS:
      continue
    elif isinstance(value, dict) and isinstance(schema[key], dict):
      unknown += unknown_fields(value, schema[key], name + ".")
  return unknown


def _known_fields(schema: dict[str, Any], prefix: str = "") -> list[str]:
  names = []
  for key, value in schema.items():
    names.append(f"{prefix}{key}")
    if isinstance(value, dict):
      names += _known_fields(value, f"{prefix}{key}.")
  return names


def describe_unknown(names: list[str]) -> str:
  """'rl.klcoef (did you mean rl.kl_coef?), foo' for unknown dotted field names."""
  known = _known_fields(base_config().to_dict())
  described = []
  for name in names:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    described.append(f"{name} (did you mean {close[0]}?)" if close else name)
  return ", ".join(described)


def check_overrides(argv: list[str], flag: str = "config") -> None:
  """Rejects `--config.<field>=...` overrides of fields the schema lacks, naming the
  field and the closest known one (ml_collections alone raises a bare KeyError)."""
  schema = base_config().to_dict()
  for arg in argv[1:]:
    if not arg.startswith(f"--{flag}."):
      continue
    name = arg[len(flag) + 3:].split("=", 1)[0]
    if any(name.startswith(f"{free}.") for free in FREE_FORM_FIELDS):
      continue
    if unknown_fields(_nested(name), schema):
      raise ValueError(f"--{flag}.{name}: unknown config field {describe_unknown([name])}")


def unknown_names(names: list[str]) -> list[str]:
  """The dotted field or section names (`optim.learning_rate`, `optim`) the schema lacks."""
  schema = base_config().to_dict()
  return [name for name in names if unknown_fields(_nested(name), schema)]


def _nested(dotted: str) -> dict[str, Any]:
  """'a.b.c' -> {'a': {'b': {'c': None}}}."""
  out: dict[str, Any] = {}
  node = out
  *parents, leaf = dotted.split(".")
  for part in parents:
    node = node.setdefault(part, {})
  node[leaf] = None
  return out


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Validates `config` and fills derived fields; returns a new locked ConfigDict.

  The checks are the settings tree's (`run_settings.RunSettings`, each section checked
  by the subsystem that owns it); this function adds the names of unknown fields.
  """
  as_dict = config.to_dict()
  extra = unknown_fields(as_dict, base_config().to_dict())
  if extra:
    raise ValueError(f"unknown config field(s): {describe_unknown(extra)}")
  settings = run_settings.RunSettings.from_config(as_dict)
  c = ml_collections.ConfigDict(as_dict)
  c.num_steps, c.budget_rollouts = settings.num_steps, settings.budget_rollouts
  c.lock()
  return c


def settings(config: ml_collections.ConfigDict) -> run_settings.RunSettings:
  """The typed tree of a resolved config: what everything below the command line reads."""
  return run_settings.RunSettings.from_config(config)


def as_settings(config: ml_collections.ConfigDict | run_settings.RunSettings
                ) -> run_settings.RunSettings:
  """A run's typed settings: a ConfigDict (the command line's, a notebook's, a test's)
  is resolved here, once; typed settings pass through. Everything below reads the
  frozen tree."""
  if isinstance(config, run_settings.RunSettings):
    return config
  return settings(resolve(config))


def resolve_dict(fields: dict[str, Any]) -> dict[str, Any]:
  """`resolve` of a whole config given as a plain nested dict (a planner prescription,
  `prescribe.to_config`); the resolved config as a plain dict, as written to JSON."""
  return resolve(ml_collections.ConfigDict(fields)).to_dict()
