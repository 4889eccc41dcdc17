"""Suite-wide setup: one XLA persistent compilation cache for the whole test run.

Many tests compile the same programs: the micro preset's sampler and train step in
every `isojax.main` subprocess, the same model shapes in several test files. A cache
shared by the run's processes (both pytest-xdist workers and their subprocesses, which
inherit the environment) compiles each once. It starts empty in a fresh temporary
directory, so every program is still compiled by the run that tests it, and it is
removed at the end. A cache directory already in the environment is used as it is.
XLA:CPU's instruction set is capped as in the entry points (`isojax.cpu_isa`).

Most of the suite's time is compiling, and about 40% of XLA:CPU's compile time is LLVM
optimising the generated code. The suite compiles with LLVM's optimisation off
(`--xla_backend_optimization_level=0`; XLA's default is 3): the same HLO programs, passes,
fusions and buffer assignment, less compile time (34 tests of
`tests/rl/test_every_option.py`: 68 s at the default, 37-42 s at 0), results that may
differ from the commands' in their last bits. Tests compare numbers with tolerances, and the
bit-identity tests compare runs compiled alike. A level already in XLA_FLAGS is kept
(`XLA_FLAGS=--xla_backend_optimization_level=3` runs the suite as the commands compile).

Each compiled XLA:CPU program holds about six memory mappings of its code for as long
as JAX caches it, and a worker compiles thousands of programs: near the kernel's limit
on a process's mappings (`vm.max_map_count`, 65,530 by default) the next compilation
cannot map its code and the worker dies with a segmentation fault inside XLA. After a
test that leaves its worker above `worker_memory.MAPPINGS_BEFORE_CLEARING`, JAX's caches
are cleared (the persistent cache still spares most recompilations).

The `slow` marker takes the longest tests out of the fast tier
(`python -m pytest -q -n 2 -m "not slow" tests`); each says why it is slow.
"""

import gc
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

import worker_memory  # tests/worker_memory.py, beside this file

# Before anything imports jax (it reads these variables once). This file is imported by
# pytest's main process before it starts the xdist workers, which inherit the variables.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="isojax-tests-jax-cache-")
  os.environ["ISOJAX_TESTS_OWN_JAX_CACHE"] = os.environ["JAX_COMPILATION_CACHE_DIR"]
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def _with_xla_flag(flag: str) -> str:
  """This process's XLA_FLAGS with `flag` appended."""
  return " ".join(filter(None, [os.environ.get("XLA_FLAGS"), flag]))


if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = _with_xla_flag("--xla_backend_optimization_level=0")
# The instruction-set cap the entry points use (isojax.cpu_isa), so tests compute what
# the commands do.
from isojax import cpu_isa  # pylint: disable=g-import-not-at-top,wrong-import-position

cpu_isa.pin()
# pylint: disable=g-import-not-at-top,wrong-import-position,wrong-import-order
from etils.epath import backend as epath_backend
from fsspec.implementations import memory


@pytest.fixture(autouse=True)
def _keep_mappings_below_the_kernel_limit():
  """Clears JAX's caches after a test that leaves this worker with many mappings."""
  yield
  if worker_memory.process_mappings() > worker_memory.MAPPINGS_BEFORE_CLEARING:
    import jax  # pylint: disable=g-import-not-at-top
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def on_8_devices(tmp_path):
  """Runs Python code in a child process with 8 fake CPU devices (in `tmp_path`) and this
  run's other XLA flags; returns its stdout, failing the test with its stderr if it exits
  non-zero."""
  def run(code: str) -> str:
    env = dict(os.environ, XLA_FLAGS=_with_xla_flag("--xla_force_host_platform_device_count=8"),
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout
  return run


class _FakeGCS(memory.MemoryFileSystem):
  """gs:// in memory; appending raises, since GCS objects cannot be appended to."""
  protocol = ("gs", "gcs")
  store, pseudo_dirs = {}, [""]

  def __init__(self, *args, finalize_on_close=None, **kwargs):
    del finalize_on_close  # a gcsfs option epath passes
    super().__init__(*args, **kwargs)

  def _open(self, path, mode="rb", **kwargs):
    if "a" in mode:
      raise NotImplementedError("object stores cannot append")
    return super()._open(path, mode, **kwargs)


@pytest.fixture
def fake_gcs(monkeypatch):
  if importlib.util.find_spec("tensorflow") is not None:
    pytest.skip("epath sends gs:// to tf.io.gfile when TensorFlow is installed")
  registry = sys.modules["fsspec.registry"]._registry  # pylint: disable=protected-access
  for name in _FakeGCS.protocol:
    monkeypatch.setitem(registry, name, _FakeGCS)  # restored after the test
  # pylint: disable-next=protected-access
  epath_backend.fsspec_backend._get_filesystem.cache_clear()
  _FakeGCS.store.clear()
  _FakeGCS.pseudo_dirs[:] = [""]
  yield _FakeGCS.store
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "slow(reason): in the full suite only, not the fast tier (-m 'not slow'); "
      "the reason says what makes it slow")
  # With workers (-n 2), each takes the next test when it is free (pytest-xdist's
  # "worksteal"): the suite's minutes-long tests cannot leave one worker idle at the end.
  if getattr(config.option, "dist", "no") == "load":
    config.option.dist = "worksteal"


def pytest_collection_modifyitems(config, items):
  """The slow tests first (in their order): started early, they end before the last
  short ones, so both workers finish together."""
  del config
  items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_unconfigure(config):
  own = os.environ.get("ISOJAX_TESTS_OWN_JAX_CACHE")
  if own and not hasattr(config, "workerinput"):  # the main process, after the workers
    shutil.rmtree(own, ignore_errors=True)
