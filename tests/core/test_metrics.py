"""Unbiased best@k / worst@k against brute-force enumeration of k-subsets."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from isojax import metrics


def _brute(correct: list[bool], k: int):
  subsets = list(itertools.combinations(correct, k))
  best = np.mean([any(s) for s in subsets])
  worst = np.mean([all(s) for s in subsets])
  return best, worst


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 9).flatmap(lambda n: st.tuples(
    st.just(n), st.integers(1, n), st.lists(st.integers(0, n), min_size=1, max_size=5))))
def test_estimators_equal_subset_enumeration(args):
  n, k, counts = args
  best = metrics.best_at_k_per_problem(counts, n, k)
  worst = metrics.worst_at_k_per_problem(counts, n, k)
  for i, c in enumerate(counts):
    b, w = _brute([True] * c + [False] * (n - c), k)
    assert best[i] == pytest.approx(b, abs=1e-12)
    assert worst[i] == pytest.approx(w, abs=1e-12)


def test_summary_hand_computed():
  # 4 samples, k = 2. Counts 4, 2, 0:
  #   best@2  = [1, 1 - C(2,2)/C(4,2) = 5/6, 0],  worst@2 = [1, C(2,2)/C(4,2) = 1/6, 0]
  out = metrics.summarize_correct([4, 2, 0], 4, 2)
  assert out["val/avg@2"] == pytest.approx(0.5)
  assert out["val/best@2"] == pytest.approx((1 + 5 / 6) / 3)
  assert out["val/worst@2"] == pytest.approx((1 + 1 / 6) / 3)
  assert out["val/avg@2_stderr"] == pytest.approx(np.std([1, .5, 0], ddof=1) / np.sqrt(3))


def test_large_counts_do_not_overflow():
  # C(N-c, k) / C(N, k) = prod_{i<c} (N-k-i) / (N-i): closed form for small c.
  best = metrics.best_at_k_per_problem([3], 1000, 500)[0]
  assert best == pytest.approx(1 - (500 / 1000) * (499 / 999) * (498 / 998), rel=1e-9)
  worst = metrics.worst_at_k_per_problem([998], 1000, 500)[0]
  assert worst == pytest.approx((500 / 1000) * (499 / 999), rel=1e-9)


@pytest.mark.parametrize("counts,n,k", [([5], 4, 2), ([1], 4, 5), ([-1], 4, 1)])
def test_rejects_bad_counts(counts, n, k):
  with pytest.raises(ValueError):
    metrics.summarize_correct(counts, n, k)


def test_histogram_counts_problems_per_correct_count():
  assert metrics.pass_count_histogram([0, 0, 2, 4, 4, 4], 4) == [2, 0, 1, 0, 3]
