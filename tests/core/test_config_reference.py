"""The typed settings are the one source of every field: the doc's field reference is
generated from them, every field has its meaning, and a shipped config's tree holds
exactly the values its ConfigDict holds."""

import dataclasses
import importlib
import json
import os

import pytest

from isojax import configs
from isojax.config import config_lib, config_reference, run_settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "configs.md")


def test_the_docs_field_reference_is_the_generated_one():
  with open(DOC) as f:
    doc = f.read()
  assert config_reference.rewrite(doc) == doc, (
      "docs/configs.md's field reference differs from the settings' fields: run "
      "`python -m launch.config_reference`")


def _leaf_fields(cls, prefix=""):
  for f in dataclasses.fields(cls):
    if dataclasses.is_dataclass(f.default_factory):
      yield from _leaf_fields(f.default_factory, f"{prefix}{f.name}.")
    else:
      yield f"{prefix}{f.name}", f


def test_every_field_has_a_meaning():
  for name, f in _leaf_fields(run_settings.RunSettings):
    assert f.metadata.get("doc", "").strip(), f"{name}: no meaning (validation.field)"


def _plain(value):
  """JSON's view of a value (tuples and lists alike), as config.json stores it."""
  return json.loads(json.dumps(value))


def _run_configs():
  names = sorted(n[:-3] for n in os.listdir(configs.PACKAGE_DIR)
                 if n.endswith(".py") and n not in ("__init__.py", "from_json.py")
                 and not n.startswith("sweep_"))
  return [pytest.param(name, id=name) for name in names]


@pytest.mark.parametrize("name", _run_configs())
def test_a_shipped_configs_settings_hold_its_values(name):
  """RunSettings.from_config keeps every field of the resolved ConfigDict, value for
  value, and nothing else: what config.json records is what the code below reads."""
  config = config_lib.resolve(importlib.import_module(f"isojax.configs.{name}").get_config())
  want = _plain(config.to_dict())
  assert _plain(config_lib.settings(config).to_dict()) == want


def test_base_config_is_the_settings_defaults_with_the_command_lines_types():
  """The ConfigDict the command line overrides: every field of the tree, with each
  default, and the fields whose default is None typed for their overrides."""
  base = config_lib.base_config()
  assert sorted(_flat(base.to_dict())) == sorted(n for n, _ in _leaf_fields(
      run_settings.RunSettings))
  assert base.num_steps is None and base.task.instruction is None
  base.num_steps = 20            # a placeholder of int: set as an int ...
  with pytest.raises(TypeError):
    base.budget_rollouts = "many"  # ... and refused as anything else
  assert base.rl.kl_coef == 0.0 and isinstance(base.optim.learning_rate, float)


def _flat(tree, prefix=""):
  for key, value in tree.items():
    if isinstance(value, dict) and f"{prefix}{key}" != "task.dataset_kwargs":
      yield from _flat(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"
