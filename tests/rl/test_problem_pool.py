"""No-Positive-Resampling pool: pass counts, retirement, sampling, checkpointing."""

import io
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isojax.rl.problem_pool import ProblemPool


def test_counts_and_pass_rates():
  pool = ProblemPool(4)
  pool.update([0, 0, 1, 1, 1, 3], [1, 0, 1, 1, 0, 0.5])
  np.testing.assert_array_equal(pool.attempts_G, [2, 3, 0, 1])
  np.testing.assert_allclose(pool.successes_G, [1, 2, 0, 0.5])
  np.testing.assert_allclose(pool.pass_rates(), [0.5, 2 / 3, 0, 0.5])
  np.testing.assert_array_equal(pool.active_ids(), [0, 1, 2, 3])


def test_retires_at_threshold_not_below():
  pool = ProblemPool(3, threshold=0.9)
  pool.update([0] * 10 + [1] * 10 + [2] * 10,
              [1] * 9 + [0] + [1] * 8 + [0] * 2 + [1] * 10)
  # 9/10 = 0.9 retires (>=), 8/10 stays, 10/10 retires.
  np.testing.assert_array_equal(pool.active_ids(), [1])


def test_retirement_is_permanent_and_counts_accumulate():
  pool = ProblemPool(2)
  pool.update([0, 0, 1], [1, 1, 0])
  assert list(pool.active_ids()) == [1]
  pool.update([0, 0, 0, 0], [0, 0, 0, 0])  # a batch sampled before retirement
  np.testing.assert_allclose(pool.pass_rates()[0], 2 / 6)
  assert list(pool.active_ids()) == [1]
  pool.update([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1] * 10)  # 10/11 = 0.909
  assert list(pool.active_ids()) == []


def test_min_attempts_delays_retirement():
  pool = ProblemPool(1, min_attempts=4)
  pool.update([0, 0, 0], [1, 1, 1])
  assert list(pool.active_ids()) == [0]
  pool.update([0], [1])
  assert list(pool.active_ids()) == []


@settings(max_examples=30, deadline=None)
@given(batches=st.lists(st.lists(st.tuples(st.integers(0, 4), st.sampled_from([0.0, 1.0])),
                                 max_size=12), max_size=6))
def test_matches_python_reference(batches):
  pool = ProblemPool(5, threshold=0.75)
  succ, att, retired = [0.0] * 5, [0] * 5, [False] * 5
  for batch in batches:
    ids = np.array([i for i, _ in batch], np.int64)
    rewards = np.array([r for _, r in batch])
    pool.update(ids, rewards)
    for i, r in batch:
      succ[i] += r
      att[i] += 1
    for i in range(5):
      retired[i] = retired[i] or (att[i] >= 1 and succ[i] / att[i] >= 0.75)
  np.testing.assert_array_equal(pool.attempts_G, att)
  np.testing.assert_allclose(pool.successes_G, succ)
  np.testing.assert_array_equal(pool.active_ids(), [i for i in range(5) if not retired[i]])


def test_sample_from_active_pool():
  pool = ProblemPool(10)
  pool.update([2, 5, 7], [1, 1, 1])
  ids = pool.sample(np.random.default_rng(0), 4)
  assert ids.shape == (4,) and len(set(ids.tolist())) == 4
  assert not set(ids.tolist()) & {2, 5, 7}
  np.testing.assert_array_equal(ids, pool.sample(np.random.default_rng(0), 4))
  counts = np.bincount(np.concatenate(
      [pool.sample(np.random.default_rng(s), 3) for s in range(700)]), minlength=10)
  assert np.all(counts[[2, 5, 7]] == 0)
  np.testing.assert_allclose(counts[pool.active_ids()] / 700, 3 / 7, atol=0.07)


def test_sample_falls_back_and_warns_when_pool_is_small():
  pool = ProblemPool(5)
  pool.update([0, 1, 2], [1, 1, 1])
  with pytest.warns(UserWarning, match="only 2 active problems for a batch of 6"):
    ids = pool.sample(np.random.default_rng(0), 6)
  assert ids.shape == (6,)
  assert set(ids.tolist()) == {3, 4}
  pool.update([3, 4], [1, 1])
  with pytest.raises(ValueError, match="retired all 5 problems"):
    pool.sample(np.random.default_rng(0), 2)


def test_no_warning_when_pool_is_large_enough():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    ProblemPool(3).sample(np.random.default_rng(0), 3)


def test_dict_round_trip_through_npz():
  pool = ProblemPool(6, threshold=0.8, min_attempts=2)
  pool.update([0, 0, 1, 3, 3, 3], [1, 1, 0, 1, 0.5, 1])
  buffer = io.BytesIO()
  np.savez(buffer, **pool.to_dict())
  buffer.seek(0)
  restored = ProblemPool.from_dict(dict(np.load(buffer)))
  assert restored.threshold == 0.8 and restored.min_attempts == 2
  np.testing.assert_array_equal(restored.successes_G, pool.successes_G)
  np.testing.assert_array_equal(restored.attempts_G, pool.attempts_G)
  np.testing.assert_array_equal(restored.active_ids(), pool.active_ids())
  np.testing.assert_array_equal(restored.sample(np.random.default_rng(1), 3),
                                pool.sample(np.random.default_rng(1), 3))
  restored.update([1], [1])  # the copy is independent of the original
  assert pool.attempts_G[1] == 1


def test_errors():
  with pytest.raises(ValueError, match="num_problems"):
    ProblemPool(0)
  with pytest.raises(ValueError, match="threshold"):
    ProblemPool(3, threshold=1.5)
  pool = ProblemPool(3)
  with pytest.raises(ValueError, match=r"\[0, 3\)"):
    pool.update([3], [1])
  with pytest.raises(ValueError, match="one reward per rollout"):
    pool.update([0, 1], [1])
  with pytest.raises(ValueError, match=r"\[0, 1\]"):
    pool.update([0], [2.0])
  with pytest.raises(ValueError, match="lacks"):
    ProblemPool.from_dict({"successes": np.zeros(3)})
  with pytest.raises(ValueError, match="problems_per_batch"):
    pool.sample(np.random.default_rng(0), 0)
