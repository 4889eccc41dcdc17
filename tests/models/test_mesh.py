"""The mesh follows the hardware: one block of `data` per slice, ICI neighbours on TPU."""

import dataclasses
import importlib.util
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from isojax.models import sharding

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass(frozen=True)
class FakeDevice:
  """What the mesh builders read of a device; a CPU-like kind, so no torus to fold."""
  id: int
  slice_index: int
  platform: str = "cpu"
  device_kind: str = "fake"
  process_index: int = 0


def test_devices_of_two_slices_split_only_the_data_axis():
  # Interleaved on purpose: device i is in slice i % 2.
  devices = [FakeDevice(i, i % 2) for i in range(16)]
  grid = sharding.device_grid((4, 2, 2), devices)
  assert grid.shape == (4, 2, 2)
  assert {d.slice_index for d in grid[:2].flat} == {0}
  assert {d.slice_index for d in grid[2:].flat} == {1}
  assert sorted(d.id for d in grid.flat) == list(range(16))


def test_data_axis_must_divide_over_the_slices():
  devices = [FakeDevice(i, i // 4) for i in range(12)]  # three slices of four
  with pytest.raises(ValueError, match=r"mesh.data=2 .* 3 slices .*'fsdp': 6"):
    sharding.device_grid((2, 6, 1), devices)
  with pytest.raises(ValueError, match="unequal sizes"):
    sharding.device_grid((2, 3, 1), [FakeDevice(i, int(i >= 4)) for i in range(6)])


def test_one_slice_keeps_the_device_order_off_tpu():
  devices = [FakeDevice(i, 0) for i in range(8)]
  grid = sharding.device_grid((2, 2, 2), devices)
  assert [d.id for d in grid.flat] == list(range(8))
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  assert mesh.shape == {"data": jax.device_count(), "fsdp": 1, "tensor": 1}


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu not installed")
def test_tpu_topologies_fold_onto_the_torus_and_split_data_over_slices():
  code = """
    import os
    os.environ["TPU_SKIP_MDS_QUERY"] = "1"; os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    import jax
    jax.config.update("jax_platforms", "cpu")
    from jax.experimental import topologies
    from isojax.models import sharding

    def devices(slices):  # a v5p-64 slice: 2x4x4 chips
      return topologies.get_topology_desc(
          platform="tpu", topology_name="v5:2x4x4", chip_config_name="megacore",
          chips_per_host_bounds=(2, 2, 1), num_slices=slices, wrap=(False,) * 3).devices

    hops = lambda a, b: sum(abs(x - y) for x, y in zip(a.coords, b.coords))
    grid = sharding.make_mesh({"data": 1, "fsdp": 8, "tensor": 4}, devices(1)).devices
    # Along `tensor` every step is one ICI hop (a reshape of the id order is not).
    assert all(hops(a, b) == 1 for row in grid.reshape(-1, 4) for a, b in zip(row, row[1:]))
    mesh = sharding.make_mesh({"data": 2, "fsdp": -1, "tensor": 1}, devices(2))
    assert mesh.shape == {"data": 2, "fsdp": 32, "tensor": 1}
    assert [{d.slice_index for d in block.flat} for block in mesh.devices] == [{0}, {1}]
    try:
      sharding.make_mesh({"data": 1, "fsdp": -1, "tensor": 1}, devices(2))
      raise SystemExit("expected a ValueError")
    except ValueError as e:
      assert "mesh.data=1" in str(e) and "2 slices" in str(e), e
    print("ok")
  """
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert proc.stdout.strip() == "ok"
