"""Property tests of the allocation grids against brute-force enumeration."""

import itertools

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from isojax.planner import grids

_POWERS = [2 ** i for i in range(15)]  # 1 .. 16384, an independent power-of-two list


def _brute_pairs(b_max, problems_range, rollouts_range):
  in_range = lambda x, r: r[0] <= x <= r[1]
  return {(b_p, n) for b_p, n in itertools.product(_POWERS, _POWERS)
          if in_range(b_p, problems_range) and in_range(n, rollouts_range) and b_p * n <= b_max}


ranges = st.tuples(st.integers(1, 2048), st.integers(1, 2048)).map(sorted).map(tuple)
# Per-test settings (not a global profile, which would leak into other suites).
_SETTINGS = settings(max_examples=150, deadline=None, database=None)


@_SETTINGS
@given(b_max=st.integers(1, 1 << 14), problems_range=ranges, rollouts_range=ranges)
def test_batch_grid_is_complete_sorted_and_duplicate_free(b_max, problems_range,
                                                          rollouts_range):
  grid = grids.batch_grid(b_max, problems_range, rollouts_range)
  assert grid == sorted(set(grid))
  assert set(grid) == _brute_pairs(b_max, problems_range, rollouts_range)


@_SETTINGS
@given(budget=st.integers(1, 1 << 22), b_max=st.integers(1, 1 << 14),
       problems_range=ranges, rollouts_range=ranges, min_steps=st.integers(1, 64))
def test_iso_compute_grid_exact(budget, b_max, problems_range, rollouts_range, min_steps):
  expected = {(b_p, n, budget // (b_p * n))
              for b_p, n in _brute_pairs(b_max, problems_range, rollouts_range)
              if budget % (b_p * n) == 0 and budget // (b_p * n) >= min_steps}
  if not expected:
    with pytest.raises(grids.BudgetTooSmallError):
      grids.iso_compute_grid(budget, b_max, problems_range, rollouts_range,
                             min_steps=min_steps)
    return
  grid = grids.iso_compute_grid(budget, b_max, problems_range, rollouts_range,
                                min_steps=min_steps)
  triples = [(a.problems_per_batch, a.rollouts_per_problem, a.num_steps) for a in grid]
  assert len(triples) == len(set(triples))
  assert set(triples) == expected
  for a in grid:
    assert a.problems_per_batch * a.rollouts_per_problem * a.num_steps == budget
    assert a.rollouts == budget and a.batch_rollouts <= b_max and a.num_steps >= min_steps


@_SETTINGS
@given(budget=st.integers(1, 1 << 22), b_max=st.integers(1, 1 << 14),
       problems_range=ranges, rollouts_range=ranges, min_steps=st.integers(1, 64))
def test_iso_compute_grid_floor(budget, b_max, problems_range, rollouts_range, min_steps):
  expected = {(b_p, n) for b_p, n in _brute_pairs(b_max, problems_range, rollouts_range)
              if budget // (b_p * n) >= min_steps}
  if not expected:
    with pytest.raises(grids.BudgetTooSmallError, match="budget_rollouts|exceeds|no power of two"):
      grids.iso_compute_grid(budget, b_max, problems_range, rollouts_range,
                             min_steps=min_steps, exact=False)
    return
  grid = grids.iso_compute_grid(budget, b_max, problems_range, rollouts_range,
                                min_steps=min_steps, exact=False)
  assert {(a.problems_per_batch, a.rollouts_per_problem) for a in grid} == expected
  assert len(grid) == len(expected)
  for a in grid:
    # Spends at most C and wastes less than one batch.
    assert a.rollouts <= budget < a.rollouts + a.batch_rollouts
    assert a.batch_rollouts <= b_max and a.num_steps >= min_steps


@_SETTINGS
@given(log_b=st.integers(0, 14), steps=st.lists(st.integers(1, 500), min_size=1, max_size=6),
       problems_range=ranges, rollouts_range=ranges)
def test_fixed_batch_grid(log_b, steps, problems_range, rollouts_range):
  batch = 2 ** log_b
  pairs = {(b_p, n) for b_p, n in _brute_pairs(batch, problems_range, rollouts_range)
           if b_p * n == batch}
  if not pairs:
    with pytest.raises(grids.BudgetTooSmallError):
      grids.fixed_batch_grid(batch, steps, problems_range, rollouts_range)
    return
  grid = grids.fixed_batch_grid(batch, steps, problems_range, rollouts_range)
  triples = [(a.problems_per_batch, a.rollouts_per_problem, a.num_steps) for a in grid]
  assert len(triples) == len(set(triples))
  assert set(triples) == {(b_p, n, m) for b_p, n in pairs for m in steps}
  assert all(a.batch_rollouts == batch and a.rollouts == batch * a.num_steps for a in grid)


@_SETTINGS
@given(log_bp=st.integers(0, 10), budget=st.integers(1, 1 << 20), b_max=st.integers(1, 1 << 14),
       rollouts_range=ranges)
def test_fixed_problems_grid(log_bp, budget, b_max, rollouts_range):
  b_p = 2 ** log_bp
  expected = {(b_p, n) for bp, n in _brute_pairs(b_max, (b_p, b_p), rollouts_range)
              if budget % (bp * n) == 0}
  if not expected:
    with pytest.raises(grids.BudgetTooSmallError):
      grids.fixed_problems_grid(b_p, budget, b_max, rollouts_range)
    return
  grid = grids.fixed_problems_grid(b_p, budget, b_max, rollouts_range)
  assert {(a.problems_per_batch, a.rollouts_per_problem) for a in grid} == expected
  assert all(a.rollouts == budget for a in grid)


def test_fixed_problems_grid_rejects_non_power_of_two():
  with pytest.raises(ValueError, match="problems_per_batch=24"):
    grids.fixed_problems_grid(24, 1 << 16, 1024, (2, 64))


def test_too_small_budget_message_names_the_smallest_allocation():
  with pytest.raises(grids.BudgetTooSmallError, match=r"8 \* 2 = 16 .* needs 160 rollouts"):
    grids.iso_compute_grid(100, 1024, (8, 64), (2, 64), min_steps=10)


def test_bad_range_is_an_error():
  with pytest.raises(ValueError, match="problems_range"):
    grids.batch_grid(1024, (64, 8), (2, 4))


def test_compute_units():
  # 1e6 rollouts of 500 tokens at 2,000 tokens/s per accelerator: 5e8 / 2e3 / 3600 h.
  assert grids.tokens(1e6, 500) == 5e8
  assert grids.accelerator_hours(1e6, 500, 2000) == pytest.approx(5e8 / 2000 / 3600)
  assert grids.rollouts_for_hours(5e8 / 2000 / 3600, 500, 2000) == 1_000_000
  assert grids.rollouts_for_hours(1.0, 100, 10) == 360  # 36,000 tokens / 100
  with pytest.raises(ValueError, match="tokens_per_accelerator_second"):
    grids.accelerator_hours(1, 1, 0)
