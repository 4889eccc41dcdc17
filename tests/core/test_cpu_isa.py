"""isojax.cpu_isa: the XLA:CPU instruction-set cap of the entry points."""

import os
import platform
import subprocess
import sys

import pytest

from isojax import cpu_isa

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
AVX512_FLAGS = "fpu sse sse2 ssse3 sse4_1 sse4_2 avx fma avx2 avx512f avx512bw"


@pytest.mark.parametrize("flags,want", [
    (AVX512_FLAGS, "AVX512"),
    ("sse4_2 avx fma avx2", "AVX2"),
    ("sse4_2 avx avx2", "AVX"),        # AVX2 without FMA is not XLA's AVX2 level
    ("sse4_2 avx", "AVX"),
    ("sse2 sse4_2", "SSE4_2"),
    ("sse2", "x86_64"),
])
def test_host_isa_from_cpu_flags(flags, want):
  assert cpu_isa.host_isa({"flags": flags}, machine="x86_64") == want


def test_host_isa_off_x86_is_the_machine():
  assert cpu_isa.host_isa({}, machine="aarch64") == "aarch64"


def test_pinned_flags_add_the_cap_and_keep_other_flags():
  env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
  assert cpu_isa.pinned_flags(env, machine="x86_64") == (
      "--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=AVX2")
  assert cpu_isa.pinned_flags({}, machine="x86_64") == "--xla_cpu_max_isa=AVX2"
  assert cpu_isa.pinned_flags({cpu_isa.ENV: "AVX"}, machine="x86_64") == (
      "--xla_cpu_max_isa=AVX")


def test_pinned_flags_leave_an_explicit_choice_alone():
  assert cpu_isa.pinned_flags({"XLA_FLAGS": "--xla_cpu_max_isa=SSE4_2"},
                              machine="x86_64") is None
  assert cpu_isa.pinned_flags({cpu_isa.ENV: "native"}, machine="x86_64") is None
  assert cpu_isa.pinned_flags({}, machine="aarch64") is None
  with pytest.raises(ValueError, match="ISOJAX_CPU_MAX_ISA='AVX3'"):
    cpu_isa.pinned_flags({cpu_isa.ENV: "AVX3"}, machine="x86_64")


def test_pin_is_idempotent():
  env = {}
  cpu_isa.pin(env)
  cpu_isa.pin(env)
  if env:  # x86 hosts
    assert env["XLA_FLAGS"].split() == ["--xla_cpu_max_isa=AVX2"]


def test_entry_points_run_with_the_cap():
  """An entry point's process sees the cap in XLA_FLAGS before JAX starts its backend."""
  code = ("import os; from isojax import host_memory; host_memory.restart_entry_point("
          "'__main__'); import jax; jax.numpy.zeros(1).block_until_ready(); "
          "print('FLAGS=' + os.environ.get('XLA_FLAGS', ''))")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", cpu_isa.ENV)}
  proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  flags = proc.stdout.split("FLAGS=")[-1].split()
  want = ["--xla_cpu_max_isa=AVX2"] if platform.machine() in ("x86_64", "AMD64") else []
  assert [f for f in flags if f.startswith(cpu_isa.FLAG)] == want
