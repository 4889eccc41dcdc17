"""Huge pages for host buffers: when entry points restart, with what, and what it does."""

import json
import os
import platform
import subprocess
import sys

import pytest

from isojax import host_memory

GLIBC = (2, 36)

# Restarts through `reexec_with_hugepages`, then maps and touches 64 MiB with the C
# library's own malloc and reports how much of the process is in transparent huge pages.
CHILD = """
import ctypes, json, os, sys
from isojax import host_memory
host_memory.reexec_with_hugepages()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
size = 64 << 20
ctypes.memset(libc.malloc(size), 1, size)
with open("/proc/self/smaps_rollup") as f:
  huge_kb = sum(int(l.split()[1]) for l in f if l.startswith("AnonHugePages:"))
print(json.dumps(dict(tunables=os.environ.get("GLIBC_TUNABLES"), argv=sys.argv[1:],
                      pid=os.getpid(), huge_kb=huge_kb)))
"""


@pytest.mark.parametrize("environ, expected", [
    ({}, "glibc.malloc.hugetlb=1"),
    ({"GLIBC_TUNABLES": ""}, "glibc.malloc.hugetlb=1"),
    ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"},
     "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
])
def test_env_adds_the_tunable_and_keeps_the_rest(environ, expected):
  env = host_memory.hugepage_env({"PATH": "/bin", **environ}, glibc=GLIBC, thp="madvise")
  assert env == {"PATH": "/bin", "GLIBC_TUNABLES": expected}


@pytest.mark.parametrize("environ, glibc, thp", [
    ({}, None, "madvise"),                                # not glibc (musl, macOS)
    ({}, (2, 34), "madvise"),                             # glibc without the tunable
    ({}, GLIBC, "always"),                                # huge pages already in use
    ({}, GLIBC, "never"),                                 # nothing to gain
    ({}, GLIBC, None),                                    # no THP file (not Linux)
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, GLIBC, "madvise"),  # opted out
    ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}, GLIBC, "madvise"),  # already restarted
])
def test_env_is_none_when_a_restart_changes_nothing(environ, glibc, thp):
  assert host_memory.hugepage_env(environ, glibc=glibc, thp=thp) is None


@pytest.mark.parametrize("text, mode", [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
    ("always madvise [never]\n", "never"), ("garbage\n", None)])
def test_thp_mode_reads_the_bracketed_choice(tmp_path, text, mode):
  path = tmp_path / "enabled"
  path.write_text(text)
  assert host_memory.thp_mode(str(path)) == mode
  assert host_memory.thp_mode(str(tmp_path / "missing")) is None


def test_glibc_version_agrees_with_platform():
  name, version = platform.libc_ver()
  if name != "glibc":
    assert host_memory.glibc_version() is None
  else:
    assert host_memory.glibc_version() == tuple(int(x) for x in version.split(".")[:2])


def _child(tmp_path, **env):
  script = tmp_path / "child.py"
  script.write_text(CHILD)
  environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  proc = subprocess.run([sys.executable, str(script), "pos", "--flag=1"], env={**environ, **env},
                        capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout), proc.stderr


needs_madvise = pytest.mark.skipif(
    host_memory.hugepage_env({}, glibc=host_memory.glibc_version(),
                             thp=host_memory.thp_mode()) is None,
    reason="needs glibc >= 2.35 and transparent huge pages in madvise mode")


@needs_madvise
def test_restart_keeps_arguments_and_backs_malloc_with_huge_pages(tmp_path):
  out, err = _child(tmp_path)
  assert out["tunables"] == "glibc.malloc.hugetlb=1"
  assert out["argv"] == ["pos", "--flag=1"]
  assert err.count("restarting with GLIBC_TUNABLES") == 1
  # At least half of the 64 MiB block sits in 2 MiB pages (the kernel may leave its
  # unaligned ends in small ones).
  assert out["huge_kb"] >= 32 << 10

  opted_out, err = _child(tmp_path, GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
  assert opted_out["tunables"] == "glibc.malloc.hugetlb=0" and "restarting" not in err
  assert opted_out["huge_kb"] < 2 << 10


@needs_madvise
@pytest.mark.parametrize("module", ["isojax.main"] + [
    pytest.param(m, marks=pytest.mark.slow("each entry point is a subprocess importing jax"))
    for m in ("launch.bench", "launch.sweep", "launch.study", "launch.profile")])
def test_entry_points_restart_before_importing_jax(module):
  """The first process imports nothing heavy (jax, numpy, absl): only after the restart.
  (`-X importtime` is in `sys.orig_argv`, so the restarted process reports its imports
  too, after the restart message.)"""
  environ = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # --helpshort: the module's imports, then absl prints the flags (and exits with 1).
  proc = subprocess.run([sys.executable, "-X", "importtime", "-m", module, "--helpshort"],
                        env=environ, cwd=root, capture_output=True, text=True, timeout=120)
  assert "--helpfull" in proc.stdout, proc.stderr[-3000:]
  before, restarted, after = proc.stderr.partition("restarting with GLIBC_TUNABLES")
  assert restarted, proc.stderr[-3000:]
  imported = lambda text: {line.split("|")[-1].strip() for line in text.splitlines()
                           if line.startswith("import time:")}
  assert not {"jax", "numpy", "absl"} & imported(before)
  assert "absl" in imported(after)   # the restarted process went on to the module


# Frees 96 MiB of 64 KiB blocks (below malloc's mmap threshold, so they stay in its
# heap) under one live block that keeps the heap's top from shrinking on its own, then
# reports the resident size after the frees and after `release_free_memory`.
RELEASE_CHILD = """
import ctypes, json
from isojax import host_memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * 4096
blocks = [libc.malloc(64 << 10) for _ in range(1536)]
for b in blocks:
  ctypes.memset(b, 1, 64 << 10)
pin = libc.malloc(64 << 10)  # from the top of the heap, above the blocks
ctypes.memset(pin, 1, 64 << 10)
for b in blocks:
  libc.free(b)
freed = rss()
released = host_memory.release_free_memory()
print(json.dumps(dict(freed=freed, after=rss(), released=released)))
"""


@pytest.mark.skipif(host_memory.glibc_version() is None, reason="malloc_trim is glibc's")
def test_release_returns_freed_heap_pages_to_the_kernel():
  # GLIBC_TUNABLES off: the huge-page tunable would round the heap to 2 MiB pages.
  env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
  proc = subprocess.run([sys.executable, "-c", RELEASE_CHILD], env=env, capture_output=True,
                        text=True, check=True)
  out = json.loads(proc.stdout)
  assert out["released"]
  assert out["freed"] - out["after"] >= 80 << 20, out  # of the 96 MiB freed
