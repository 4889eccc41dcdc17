"""Accelerators' datasheet limits, by a substring of `jax.Device.device_kind`: the
denominators of the bandwidth and MFU fractions the benches and the gpu section report.
Pure data (no JAX), so a process that only writes tables can read it."""

from __future__ import annotations

# Datasheet HBM bandwidth in bytes/s by a substring of `jax.Device.device_kind`, most
# specific first (an H100 PCIe card has less than an H100 SXM).
NOMINAL_BANDWIDTH = (
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),
    ("H200", 4.8e12),
    ("A100-SXM4-80GB", 2.039e12),
    ("A100-PCIE-80GB", 1.935e12),
    ("A100", 1.555e12),
    ("L4", 0.3e12),
)


# Datasheet dense bfloat16 matmul peak in FLOP/s (no structured sparsity) by a substring
# of `jax.Device.device_kind`, most specific first; the denominator of MFU.
NOMINAL_BF16_FLOPS = (
    ("H100 PCIe", 756e12),
    ("H100", 989.4e12),
    ("H200", 989.4e12),
    ("A100", 312e12),
    ("L4", 121e12),
    ("TPU v6 lite", 918e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5", 459e12),
    ("TPU v4", 275e12),
)


def nominal_bandwidth(device_kind: str) -> float | None:
  """The datasheet memory bandwidth (bytes/s) of a device kind, None when unknown."""
  return next((bw for name, bw in NOMINAL_BANDWIDTH if name in device_kind), None)


def nominal_flops(device_kind: str) -> float | None:
  """The datasheet dense bfloat16 peak (FLOP/s) of a device kind, None when unknown."""
  return next((f for name, f in NOMINAL_BF16_FLOPS if name in device_kind), None)
