"""The chips an ahead-of-time check compiles for (`isojax.aot`): a named TPU pod slice,
described by libtpu with nothing allocated, or N fake CPU devices; and each chip's
memory budget.

libtpu is not a dependency of isojax: the tests use cpu:N only.
"""

from __future__ import annotations

import os
import re

import jax

GIB = 1 << 30


# get_topology_desc arguments of each pod slice; chips_per_host_bounds=(2, 2, 1).
TOPOLOGIES = {
    "v5p-64": dict(topology_name="v5:2x4x4", chip_config_name="megacore", wrap=(False,) * 3),
    "v5p-128": dict(topology_name="v5:4x4x4", chip_config_name="megacore", wrap=(True,) * 3),
    "v5e-256": dict(topology_name="v5e:16x16", chip_config_name="default",
                    wrap=(True, True, False)),
    "v5e-8": dict(topology_name="v5e:2x4", chip_config_name="default", wrap=(False,) * 3),
    "v6e-8": dict(topology_name="v6e:2x4", chip_config_name="default", wrap=(False,) * 3),
}


HBM_GIB = {"TPU v5": 95, "TPU v5 lite": 16, "TPU v6 lite": 32}  # per chip (v5p, v5e, v6e)


def prepare_backend(topology: str) -> None:
  """Call before anything touches a device: a CPU backend, and libtpu for compiling only."""
  if topology.startswith("cpu:"):
    jax.config.update("jax_num_cpu_devices", _cpu_count(topology))
  else:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no GCE metadata server here
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # nothing runs on a TPU
  jax.config.update("jax_platforms", "cpu")


def _cpu_count(topology: str) -> int:
  count = topology.removeprefix("cpu:")
  if not count.isdigit() or int(count) < 1:
    raise ValueError(f"--topology={topology!r}: expected cpu:N with N >= 1")
  return int(count)


def devices(topology: str) -> list:
  """The devices of a named TPU topology (libtpu, nothing allocated) or of cpu:N."""
  if topology.startswith("cpu:"):
    count, devices = _cpu_count(topology), jax.devices("cpu")
    if len(devices) < count:
      raise ValueError(f"--topology={topology}: this process has {len(devices)} CPU "
                       f"devices; start Python with XLA_FLAGS=--xla_force_host_platform_"
                       f"device_count={count} (python -m launch.aot does it itself)")
    return devices[:count]
  slices, name = re.fullmatch(r"(?:(\d+)x)?(.*)", topology).groups()
  if name not in TOPOLOGIES:
    raise ValueError(f"--topology={topology!r}: expected cpu:N or [Kx]one of "
                     f"{sorted(TOPOLOGIES)}")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    return topologies.get_topology_desc(platform="tpu", chips_per_host_bounds=(2, 2, 1),
                                        num_slices=int(slices or 1),
                                        **TOPOLOGIES[name]).devices
  except Exception as e:  # libtpu missing or refusing: say how to get it
    raise ValueError(f"--topology={topology}: cannot describe the TPU topology ({e}); "
                     'install libtpu with pip install "jax[tpu]==<your jax version>"') from e


def hbm_bytes(devices: list, hbm_gib: float | None = None) -> int | None:
  """Per-chip memory: --hbm_gib, else what the device reports, else HBM_GIB, else unknown."""
  if hbm_gib:
    return int(hbm_gib * GIB)
  try:
    return int(devices[0].memory_stats()["bytes_limit"])
  except Exception:  # topology devices are not addressable; CPU reports nothing
    gib = HBM_GIB.get(devices[0].device_kind)
    return gib * GIB if gib else None
