"""The device mesh and the one table that maps logical axis names to mesh axes.

Parameters carry logical names (`embed`, `heads`, `mlp`, ...; see `transformer.py`);
activations use `batch`. `LOGICAL_RULES` is the only place that says which mesh axis
each name is split over, so changing the parallelism layout never touches a layer.

Mesh axes:
  data    pure data parallelism (replicated parameters)
  fsdp    data parallelism with parameters and optimizer state sharded on `embed`
  tensor  tensor parallelism over heads, MLP width and vocabulary
On TPU the axes follow the chips' interconnect (`make_mesh`); across slices only
`data` is split, since the links between slices are the slowest.
"""

from __future__ import annotations

import collections
import math
from typing import Any, Mapping

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
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
  """The (data, fsdp, tensor) mesh over `devices` (default: all), laid out physically.

  Not `jax.make_mesh`: it makes every axis `Explicit`, which would change how every
  jitted function in isojax is sharded; these axes stay `Auto`.
  """
  devices = list(jax.devices() if devices is None else devices)
  shape = mesh_shape(axis_sizes, len(devices))
  return Mesh(device_grid(shape, devices), MESH_AXES)


def make_meshes(mesh_config: Mapping[str, Any], devices=None) -> tuple[Mesh, Mesh | None]:
  """(learner mesh, generator mesh): `mesh_config["rollout_fraction"]` of `devices` (the
  last ones) sample on a data-parallel mesh with the learner's `tensor` size, the rest
  form the learner's (data, fsdp, tensor) mesh; (mesh, None) when the fraction is 0."""
  devices = list(jax.devices() if devices is None else devices)
  fraction = float(mesh_config.get("rollout_fraction", 0.0))
  if not fraction:
    return make_mesh(mesh_config, devices), None
  sampling = round(fraction * len(devices))
  if not 0 < sampling < len(devices):
    raise ValueError(f"mesh.rollout_fraction={fraction} of {len(devices)} devices gives "
                     f"{sampling} sampling devices: both sides need at least one")
  tensor = int(mesh_config["tensor"])
  if sampling % tensor:
    raise ValueError(f"mesh.rollout_fraction={fraction}: {sampling} sampling devices are not "
                     f"divisible by mesh.tensor={tensor}")
  learner = make_mesh(mesh_config, devices[:len(devices) - sampling])
  generator = make_mesh(dict(data=-1, fsdp=1, tensor=tensor), devices[len(devices) - sampling:])
  return learner, generator


def on_mesh(tree: Any, mesh: Mesh) -> Any:
  """`tree`'s arrays moved onto `mesh` with the same partition specs (a device-to-device
  resharding transfer)."""
  return jax.device_put(tree, jax.tree.map(lambda x: NamedSharding(mesh, x.sharding.spec), tree))


def device_grid(shape: tuple[int, ...], devices: list) -> np.ndarray:
  """`devices` as a `shape` array (data, fsdp, tensor) that follows the interconnect.

  In one slice, `create_device_mesh` folds the axes onto the TPU torus so that
  neighbours along each axis are ICI neighbours (on CPU and GPU it is a reshape).
  Devices of several slices (several `slice_index` values) are joined by DCN, the
  slow link, so only `data` (one gradient all-reduce per step) crosses slices:
  `create_hybrid_device_mesh` puts one block of `data` in each slice.
  """
  per_slice = collections.Counter(_slice_index(d) for d in devices)
  num_slices = len(per_slice)
  if num_slices > 1 and shape[0] % num_slices:
    raise ValueError(f"mesh.data={shape[0]} is not divisible by the {num_slices} slices the "
                     f"devices span (mesh {dict(zip(MESH_AXES, shape))}): data parallelism "
                     "is the only axis that crosses slices")
  if len(set(per_slice.values())) > 1:
    raise ValueError(f"the devices span slices of unequal sizes {dict(per_slice)}")
  try:
    if num_slices > 1:
      return mesh_utils.create_hybrid_device_mesh(
          (shape[0] // num_slices, *shape[1:]), (num_slices, 1, 1), devices,
          allow_split_physical_axes=True)
    return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (ValueError, AssertionError, NotImplementedError):
    # create_device_mesh refuses TPU device lists that are not a whole physical block
    # (3 of 8 chips, a hand-picked subset) and shapes it cannot fold onto the torus.
    # Those still get a correct mesh: the given order, each slice's devices contiguous
    # along `data`; only the ICI neighbourhood is lost.
    return np.asarray(sorted(devices, key=_slice_index), dtype=object).reshape(shape)


def _slice_index(device) -> int:
  return getattr(device, "slice_index", None) or 0


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


def batch_shards(mesh: Mesh | jax.sharding.AbstractMesh | None) -> int:
  """How many ways the `batch` logical axis is split on `mesh` (1 without a mesh)."""
  if mesh is None or mesh.empty:
    return 1
  axes = dict(LOGICAL_RULES)["batch"]
  return math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))


def constrain(x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
  """Pins an activation to its logical layout under the current mesh (`jax.set_mesh`).

  Outside a mesh context this is the identity, so single-device code, tests and
  notebooks need no mesh. Dimensions the mesh axes do not divide stay replicated.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return x
  spec = _divisible(logical_to_mesh(names), x.shape, mesh)
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


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
