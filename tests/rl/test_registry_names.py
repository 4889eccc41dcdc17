"""The RL registries' keys are exactly the names the config layer accepts, and the config
layer learns them without importing JAX or any registry."""

import os
import subprocess
import sys

import pytest

from isojax.config import config_lib
from isojax.rl import advantages, downsampling, losses, names, update

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("registry, expected", [
    (advantages.ADVANTAGE_ESTIMATORS, names.ADVANTAGES),
    (losses.POLICY_LOSSES, names.POLICY_LOSSES),
    (losses.AGGREGATIONS, names.AGGREGATIONS),
    (losses.KL_ESTIMATORS, names.KL_FORMS),
    (downsampling.DOWNSAMPLERS, names.DOWNSAMPLERS),
])
def test_registry_keys_equal_the_names(registry, expected):
  assert sorted(registry) == sorted(expected) and len(expected) == len(set(expected))


def test_modes_are_the_names():
  assert update.ZERO_VARIANCE_MODES == names.ZERO_VARIANCE_MODES
  assert names.CHOICES["downsample"] == ("none", "max_variance", "max_reward", "random")


@pytest.mark.parametrize("field, accepted", [
    ("advantage", ["batch_norm", "drgrpo", "gae", "grpo", "rloo"]),
    ("policy_loss", ["cispo", "dapo", "gspo", "ppo_clip"]),
    ("aggregation", ["constant", "prompt_mean", "sequence_mean", "token_mean"]),
    ("kl_form", ["k1", "k2", "k3"]),
    ("downsample", ["max_reward", "max_variance", "none", "random"]),
    ("zero_variance_filter", ["all", "off", "regularizers"]),
    ("advantages_on", ["generated", "selected"]),
])
def test_resolve_rejects_an_unregistered_name_naming_the_field(field, accepted):
  assert sorted(names.CHOICES) == sorted(
      ["advantage", "policy_loss", "aggregation", "kl_form", "downsample",
       "zero_variance_filter", "advantages_on"])
  c = config_lib.base_config()
  c.num_steps = 10
  c.rl[field] = "no_such_name"
  with pytest.raises(ValueError) as e:
    config_lib.resolve(c)
  assert str(e.value) == f"rl.{field}='no_such_name': expected one of {accepted}"
  if field != "downsample":  # (PODS needs more fields set)
    c.rl[field] = accepted[0]
    config_lib.resolve(c)


def test_config_layer_and_planner_import_no_jax():
  """`import isojax.planner`, planning, and `config_lib.resolve` of every shipped run
  config load no JAX, Flax or registry module: the config layer's checks and the names
  they check against live in JAX-free settings modules."""
  code = """
import importlib, sys
import isojax.planner
from isojax.config import config_lib
from isojax.planner import prescribe
for name in ("hard", "easy", "reasoning", "pods", "scalerl", "ppo", "dapo"):
  config = config_lib.resolve(importlib.import_module(f"isojax.configs.{name}").get_config())
hard = importlib.import_module("isojax.configs.hard").get_config()
grid = prescribe.sweep(65536, hard, max_batch_rollouts=1024, problems_range=(8, 16),
                       rollouts_range=(2, 64))
prescribe.to_config(grid[0], hard)
heavy = ("jax", "jaxlib", "flax", "optax", "orbax")
print(sorted(m for m in sys.modules if m.split(".")[0] in heavy
             or m in ("isojax.models.transformer", "isojax.sampling.sampler")
             or (m.startswith("isojax.rl.") and m not in ("isojax.rl.names", "isojax.rl.settings"))))
"""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip() == "[]"
