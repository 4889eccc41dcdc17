"""The device mesh and the one table that maps logical axis names to mesh axes.

Parameters carry logical names (`embed`, `heads`, `mlp`, ...; see `transformer.py`);
activations use `batch`. `LOGICAL_RULES` is the only place that says which mesh axis
each name is split over, so changing the parallelism layout never touches a layer.

Mesh axes:
  data    pure data parallelism (replicated parameters)
  fsdp    data parallelism with parameters and optimizer state sharded on `embed`
  tensor  tensor parallelism over heads, MLP width and vocabulary
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
LOGICAL_RULES = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("layers", None),
)


def mesh_shape(axis_sizes: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
  """Resolves one -1 entry to the devices left over; checks the product."""
  sizes = [int(axis_sizes[a]) for a in MESH_AXES]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh {dict(axis_sizes)}: at most one axis may be -1")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh {dict(axis_sizes)}: sizes must be positive or -1")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(f"mesh {dict(axis_sizes)}: {num_devices} devices are not "
                       f"divisible by the fixed axes' product {known}")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(f"mesh {dict(axis_sizes)} uses {math.prod(sizes)} devices, "
                     f"but {num_devices} are available")
  return tuple(sizes)


def make_mesh(axis_sizes: Mapping[str, int], devices=None) -> Mesh:
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(axis_sizes, len(devices))
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES)


def logical_to_mesh(names: tuple[str | None, ...]) -> PartitionSpec:
  rules = dict(LOGICAL_RULES)
  return PartitionSpec(*(rules.get(n) if n is not None else None for n in names))


def state_shardings(state: Any, mesh: Mesh) -> Any:
  """NamedShardings for an (abstract) nnx.State from its logical axis metadata.

  A dimension whose size the mesh axes do not divide (a 15-token vocabulary on two
  tensor shards, say) is replicated instead of failing.
  """
  with nnx.logical_axis_rules(LOGICAL_RULES):
    specs = nnx.get_partition_spec(state)
  shapes = jax.tree.map(lambda x: x.shape, state)
  return jax.tree.map(lambda p, shape: NamedSharding(mesh, _divisible(p, shape, mesh)),
                      specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _divisible(spec: PartitionSpec, shape: tuple[int, ...], mesh: Mesh) -> PartitionSpec:
  out = []
  for axes, size in zip(tuple(spec) + (None,) * (len(shape) - len(spec)), shape):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    shards = math.prod(mesh.shape[a] for a in names)
    out.append(axes if size % shards == 0 else None)
  return PartitionSpec(*out)


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
  """Leading axis split over the data-parallel axes, the rest replicated."""
  if ndim == 0:
    return replicated(mesh)
  return NamedSharding(mesh, logical_to_mesh(("batch",) + (None,) * (ndim - 1)))


def shard_batch(tree: Any, mesh: Mesh) -> Any:
  """Host arrays (identical on every process) -> global arrays split along the batch.

  Each process materialises only its own shards, so this works unchanged on one
  device, on many, and across hosts.
  """
  def put(x):
    x = np.asarray(x)
    sharding = batch_sharding(mesh, x.ndim)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
  return jax.tree.map(put, tree)


def to_host(x: jax.Array) -> np.ndarray:
  """A global (possibly multi-host) array as one NumPy array on every process."""
  if jax.process_count() == 1 or getattr(x, "is_fully_addressable", True):
    return np.asarray(x)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())
