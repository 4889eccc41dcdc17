"""The update's arrays (`rl.step.policy_arrays`) built from weights, as a run builds them,
and from their shapes, as `launch.aot` compiles a pod's step against them: the same
arrays, shapes, dtypes and placements."""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import nnx

from isojax.models import lora, settings as model_settings, sharding
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import step as rl_step


def _policy(rank: int, mesh):
  cfg = ModelConfig(vocab_size=16, num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=32, lora=model_settings.LoraSettings(rank=rank))
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  return graphdef, jax.device_put(params, sharding.state_shardings(params, mesh))


def _described(tree):
  """Each leaf's (path, shape, dtype, partition spec)."""
  return [(jax.tree_util.keystr(path), x.shape, x.dtype, x.sharding.spec)
          for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]]


@pytest.mark.parametrize("rank,keeps_reference", [(0, True), (0, False), (4, True)])
def test_abstract_arrays_are_the_runs_arrays_as_shapes(rank, keeps_reference):
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  _, params = _policy(rank, mesh)
  tx = optax.adamw(1e-3)
  run = rl_step.policy_arrays(params, tx, mesh, lora=rank > 0,
                              keeps_reference=keeps_reference)
  shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        params)
  aot = rl_step.policy_arrays(shapes, tx, mesh, lora=rank > 0,
                              keeps_reference=keeps_reference, abstract=True)
  for field in dataclasses.fields(rl_step.PolicyArrays):
    got, want = getattr(aot, field.name), getattr(run, field.name)
    assert (got is None) == (want is None), field.name
    if want is not None:
      assert _described(got) == _described(want), field.name
  # What each part is, checked against the parts themselves: LoRA trains its adapters
  # only, and the reference is the base policy (adapters at zero) or a copy.
  adapters, base = lora.split(params) if rank else (params, None)
  assert _described(run.trained) == _described(adapters)
  assert (run.frozen is None) == (rank == 0)
  if keeps_reference:
    ref = dict(nnx.to_flat_state(run.reference))
    for path, x in nnx.to_flat_state(params):
      want = np.zeros_like(x[...]) if isinstance(x, nnx.LoRAParam) else np.asarray(x[...])
      np.testing.assert_array_equal(np.asarray(ref[path][...]), want)
  moments = [x for x in jax.tree.leaves(run.opt_state) if x.ndim]
  assert sum(x.size for x in moments) == 2 * sum(x.size for x in jax.tree.leaves(adapters))
