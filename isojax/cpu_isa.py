"""XLA:CPU's instruction set, capped so that x86 machines compute the same floats.

XLA:CPU compiles for the host: on a CPU with AVX-512 it may emit 512-bit vector code
whose reductions add in another order than on an AVX2 machine, and without FMA every
multiply-add rounds twice. The same program then gives other low bits on another CPU,
and a run that samples tokens from those floats drifts into another trajectory.
`--xla_cpu_max_isa=AVX2` (an XLA flag) caps code generation at AVX2 + FMA, which
every x86 server of the last decade has, so AVX2 and AVX-512 machines compile the
same code. Libraries that pick kernels by CPU at run time are outside the flag's
reach; docs/performance.md says what was measured.

Entry points call `pin()` before JAX starts its CPU backend (XLA reads XLA_FLAGS
once, then); `ISOJAX_CPU_MAX_ISA` chooses another cap, or `native` for none, and an
`--xla_cpu_max_isa` already in XLA_FLAGS is left as it is.
"""

from __future__ import annotations

import os
import platform
from typing import Mapping, MutableMapping

FLAG = "--xla_cpu_max_isa"
ENV = "ISOJAX_CPU_MAX_ISA"
DEFAULT = "AVX2"
NATIVE = "native"
# XLA's names, lowest first, with the /proc/cpuinfo flags each one needs.
X86_LEVELS = (("SSE4_2", ("sse4_2",)), ("AVX", ("avx",)), ("AVX2", ("avx2", "fma")),
              ("AVX512", ("avx512f",)))
CPUINFO = "/proc/cpuinfo"


def _cpuinfo(path: str = CPUINFO) -> dict[str, str]:
  """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
  fields = {}
  try:
    with open(path) as f:
      for line in f:
        if not line.strip():
          break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
  except OSError:
    pass
  return fields


def host_isa(cpuinfo: Mapping[str, str] | None = None, machine: str | None = None) -> str:
  """The highest XLA x86 level the host supports, or the machine name off x86."""
  machine = machine or platform.machine()
  if machine not in ("x86_64", "AMD64"):
    return machine
  flags = set((cpuinfo if cpuinfo is not None else _cpuinfo()).get("flags", "").split())
  best = "x86_64"
  for name, needs in X86_LEVELS:
    if all(f in flags for f in needs):
      best = name
  return best


def cpu_model(cpuinfo: Mapping[str, str] | None = None) -> str:
  info = cpuinfo if cpuinfo is not None else _cpuinfo()
  return info.get("model name") or platform.processor() or platform.machine()


def pinned_flags(environ: Mapping[str, str], machine: str | None = None) -> str | None:
  """The XLA_FLAGS to run with, or None when they stay as they are."""
  flags = environ.get("XLA_FLAGS", "")
  cap = environ.get(ENV, DEFAULT)
  if cap == NATIVE or FLAG in flags or (machine or platform.machine()) not in (
      "x86_64", "AMD64"):
    return None
  if cap not in dict(X86_LEVELS):
    raise ValueError(f"{ENV}={cap!r}: expected one of {[n for n, _ in X86_LEVELS]} or "
                     f"{NATIVE!r}")
  return " ".join(filter(None, [flags, f"{FLAG}={cap}"]))


def pin(environ: MutableMapping[str, str] = os.environ) -> None:
  """Adds the ISA cap to XLA_FLAGS (call before JAX initialises its CPU backend)."""
  flags = pinned_flags(environ)
  if flags is not None:
    environ["XLA_FLAGS"] = flags


def effective_isa(environ: Mapping[str, str] = os.environ) -> str:
  """What XLA:CPU compiles for in this process: the host's level, capped by the flag."""
  host = host_isa()
  names = [n for n, _ in X86_LEVELS]
  for part in environ.get("XLA_FLAGS", "").split():
    if part.startswith(FLAG + "="):
      cap = part.split("=", 1)[1]
      if host in names and cap in names:
        return names[min(names.index(host), names.index(cap))]
  return host
