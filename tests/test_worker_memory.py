"""The suite's guard against the kernel's limit on a worker's memory mappings
(conftest.py, worker_memory.py): the mappings it counts are the kernel's, compiled
programs hold them, and clearing JAX's caches gives them back."""

import gc
import sys

import jax
import jax.numpy as jnp
import pytest

import worker_memory


def _compile(count: int) -> list:
  """`count` distinct programs, each compiled and run once; their jitted functions."""
  fns = []
  for i in range(count):
    fn = jax.jit(lambda x, i=i: jnp.cumsum(jnp.sin(x) * (i + 1)))
    fn(jnp.ones((i + 3,))).block_until_ready()
    fns.append(fn)
  return fns


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps")
def test_compiled_programs_hold_mappings_until_jax_clears_its_caches():
  jax.clear_caches()
  gc.collect()
  before = worker_memory.process_mappings()
  with open("/proc/self/maps") as f:  # the count is the kernel's list, line by line
    assert abs(before - len(f.read().splitlines())) <= 2
  fns = _compile(40)
  held = worker_memory.process_mappings() - before
  assert held >= 2 * 40, held  # at least two mappings a program
  del fns
  jax.clear_caches()
  gc.collect()
  assert worker_memory.process_mappings() - before < held / 4


def test_a_missing_maps_file_counts_none(tmp_path):
  assert worker_memory.process_mappings(str(tmp_path / "absent")) == 0
