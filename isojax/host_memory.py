"""Host memory: glibc's malloc asked to back large buffers with transparent huge pages,
and to give freed pages back between a run's phases (`release_free_memory`).

XLA:CPU allocates each execution's large buffers (activations, logits, gradients, the
sampler's caches) afresh, and glibc's malloc serves every block above its mmap
threshold from new pages that the kernel zeroes and maps 4 KiB at a time on first
touch. On a small CPU machine that page-faulting can take as long as the matmul that
writes the buffer (docs/performance.md, "Where the CPU limits are").
The glibc tunable `glibc.malloc.hugetlb=1` (glibc >= 2.35) makes malloc advise
transparent huge pages for the memory it maps, so those buffers fault in 2 MiB at a
time. Results are bit-identical: only where the bytes live changes.

Tunables are read once, when a process starts, so the entry points (`isojax.main`,
`launch.bench`, ...) call `restart_entry_point(__name__)` before anything else, their
other imports included (jax and the rest take ~3 s, which a restart would repeat). It
runs `reexec_with_hugepages()`, which replaces the process with itself, same
arguments, `GLIBC_TUNABLES` extended, when that would change anything. It does nothing off glibc, when the kernel's transparent huge pages
are `always` (already in use) or `never` (nothing to gain), or when `GLIBC_TUNABLES`
already sets `glibc.malloc.hugetlb`: `GLIBC_TUNABLES=glibc.malloc.hugetlb=0` opts out.
No library does this for a Python process (PyTorch's CPU launcher does the like with
LD_PRELOAD of another allocator, which need not be installed here), hence by hand.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import re
import sys
from typing import Mapping

from isojax import cpu_isa

TUNABLE = "glibc.malloc.hugetlb"
THP_ENABLED_FILE = "/sys/kernel/mm/transparent_hugepage/enabled"
MIN_GLIBC = (2, 35)  # the first glibc with glibc.malloc.hugetlb


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the C library when it is glibc, else None."""
  try:
    name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
  except (AttributeError, ValueError, OSError):
    return None
  match = re.match(r"(\d+)\.(\d+)", version)
  return (int(match[1]), int(match[2])) if name == "glibc" and match else None


def thp_mode(path: str = THP_ENABLED_FILE) -> str | None:
  """The kernel's transparent-huge-page mode (always | madvise | never), None if unknown."""
  try:
    with open(path) as f:
      match = re.search(r"\[(\w+)\]", f.read())
  except OSError:
    return None
  return match[1] if match else None


def hugepage_env(environ: Mapping[str, str], *, glibc: tuple[int, int] | None,
                 thp: str | None) -> dict[str, str] | None:
  """The environment to restart with, or None when restarting would change nothing."""
  tunables = environ.get("GLIBC_TUNABLES", "")
  if glibc is None or glibc < MIN_GLIBC or thp != "madvise" or TUNABLE in tunables:
    return None
  return {**environ, "GLIBC_TUNABLES": ":".join(filter(None, [tunables, f"{TUNABLE}=1"]))}


def reexec_with_hugepages() -> None:
  """Replaces this process with itself under `hugepage_env`, when that changes anything.

  Call it before any large allocation (entry points: `restart_entry_point`); the
  restarted process finds the tunable set and goes on.
  """
  env = hugepage_env(os.environ, glibc=glibc_version(), thp=thp_mode())
  if env is None or not sys.executable:  # embedded interpreters have no executable
    return
  print(f"isojax: restarting with GLIBC_TUNABLES={env['GLIBC_TUNABLES']} (huge pages for "
        f"host buffers; GLIBC_TUNABLES={TUNABLE}=0 turns this off)", file=sys.stderr)
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)


def restart_entry_point(module_name: str) -> None:
  """`cpu_isa.pin()` and `reexec_with_hugepages()` when `module_name` (the caller's `__name__`) is
  "__main__": an entry point's first statement, above its other imports (jax and the
  rest take ~3 s, which a restart would repeat); imported as a library, it does nothing."""
  if module_name == "__main__":
    cpu_isa.pin()  # before the restart, so that it inherits XLA_FLAGS too
    reexec_with_hugepages()


def release_free_memory() -> bool:
  """Returns the C heap's free pages to the kernel (glibc's `malloc_trim(0)`); True when
  it did, False off glibc.

  XLA:CPU frees a pass's buffers when the pass ends, but glibc keeps freed blocks below
  its (adaptive, up to 32 MiB) mmap threshold in its arenas, and an asynchronous
  checkpoint's host copy of the weights and optimizer state leaves the same behind once
  written. The process then holds the update's, the sampler's and the save's memory at
  once, though it never uses them together. The training loop calls this between phases
  on CPU, so the peak is the largest phase rather than their sum. Nothing changes but
  which pages are mapped; it takes milliseconds.
  """
  if glibc_version() is None:
    return False
  return bool(_libc().malloc_trim(0))


@functools.cache
def _libc() -> ctypes.CDLL:
  return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
