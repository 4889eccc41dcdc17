"""PODS selection against brute-force enumeration of all m-subsets."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from isojax.rl import advantages, downsampling


def brute_force_max_variance(rewards_N, m):
  combos = np.array(list(itertools.combinations(range(len(rewards_N)), m)))
  return np.var(rewards_N[combos], axis=1).max()


def check_indices(indices_GM, g, n, m):
  idx = np.asarray(indices_GM)
  assert idx.dtype == np.int32 and idx.shape == (g, m)
  assert np.all((idx >= 0) & (idx < n))
  assert np.all(np.diff(idx, axis=1) > 0), "distinct and ascending within each group"


def _reward_groups(rng, n, groups=12):
  """0/1 rewards, graded rewards with ties, and continuous rewards, [groups, n]."""
  binary = rng.integers(0, 2, size=(groups // 3, n)).astype(np.float64)
  graded = rng.integers(0, 3, size=(groups // 3, n)) / 2.0
  continuous = rng.normal(size=(groups - 2 * (groups // 3), n)) * 3.0
  return np.concatenate([binary, graded, continuous])


@pytest.mark.parametrize("n", range(1, 13))
def test_max_variance_equals_brute_force(n):
  rng = np.random.default_rng(n)
  # Random 0/1, graded (ties) and continuous rewards, plus a 0/1 group with every
  # possible number of correct rollouts.
  every_count = (np.arange(n)[None, :] < np.arange(n + 1)[:, None]).astype(np.float64)
  every_count = rng.permuted(every_count, axis=1)
  rewards = np.concatenate([_reward_groups(rng, n), every_count])
  # One outer jit for every m: one compilation per n keeps the test fast, and checks
  # that the selection composes under jit.
  select_all_m = jax.jit(lambda r: [
      downsampling.select_rollouts("max_variance", r, m) for m in range(1, n + 1)])
  for m, idx in enumerate(select_all_m(jnp.asarray(rewards, jnp.float32)), start=1):
    check_indices(idx, len(rewards), n, m)
    selected = np.take_along_axis(rewards, np.asarray(idx), axis=1)
    best = np.array([brute_force_max_variance(r, m) for r in rewards])
    np.testing.assert_allclose(np.var(selected, axis=1), best, rtol=1e-5, atol=1e-6,
                               err_msg=f"n={n} m={m}")
    # With 0/1 rewards: as close to m/2 correct as the group allows.
    ones_G = every_count.sum(1)
    counts_C = np.arange(m + 1)
    feasible_GC = (counts_C <= ones_G[:, None]) & (m - counts_C <= n - ones_G[:, None])
    best_dist_G = np.where(feasible_GC, np.abs(counts_C - m / 2), np.inf).min(1)
    chosen_G = selected[-(n + 1):].sum(1)
    np.testing.assert_array_equal(np.abs(chosen_G - m / 2), best_dist_G, err_msg=f"n={n} m={m}")


@settings(max_examples=20, deadline=None)
@given(rewards=st.lists(st.floats(-10, 10, width=32), min_size=6, max_size=6),
       m=st.integers(1, 6))
def test_max_variance_brute_force_hypothesis(rewards, m):
  rewards = np.array(rewards, np.float64)
  idx = downsampling.select_rollouts("max_variance", jnp.asarray(rewards, jnp.float32)[None], m)
  achieved = np.var(rewards[np.asarray(idx[0])])
  np.testing.assert_allclose(achieved, brute_force_max_variance(rewards, m),
                             rtol=1e-4, atol=1e-5)


def test_max_variance_hand_computed():
  rewards = jnp.array([[1, 0, 0, 1, 1, 1, 0, 1], [0.9, 0.1, 0.5, 0.2, 0.8, 0.3, 0.7, 0.4]])
  idx = downsampling.select_rollouts("max_variance", rewards, 4)
  np.testing.assert_array_equal(idx[1], [0, 1, 3, 4])  # 0.9, 0.8 and 0.1, 0.2
  np.testing.assert_array_equal(np.asarray(rewards)[0, np.asarray(idx[0])].sum(), 2)


def test_max_reward_and_random():
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=(5, 8))
  idx = downsampling.select_rollouts("max_reward", jnp.asarray(rewards, jnp.float32), 3)
  check_indices(idx, 5, 8, 3)
  np.testing.assert_allclose(np.take_along_axis(rewards, np.asarray(idx), 1).sum(1),
                             np.sort(rewards, 1)[:, -3:].sum(1), rtol=1e-6)
  idx_a = downsampling.select_rollouts("random", rewards, 3, rng=jax.random.key(0))
  idx_b = downsampling.select_rollouts("random", rewards, 3, rng=jax.random.key(1))
  check_indices(idx_a, 5, 8, 3)
  assert not np.array_equal(idx_a, idx_b)


def test_random_is_uniform_over_positions():
  g, n, m = 4000, 6, 2
  idx = np.asarray(downsampling.select_rollouts("random", jnp.zeros((g, n)), m,
                                                rng=jax.random.key(3)))
  freq = np.bincount(idx.ravel(), minlength=n) / g
  np.testing.assert_allclose(freq, m / n, atol=0.03)


def test_jit_with_static_m():
  fn = jax.jit(functools.partial(downsampling.select_rollouts, "max_variance", m=2))
  np.testing.assert_array_equal(fn(jnp.array([[0.0, 0.5, 1.0, 0.6]])), [[0, 2]])


@pytest.mark.parametrize("m", [0, 5, -1])
def test_m_out_of_range_names_m_and_n(m):
  with pytest.raises(ValueError, match=rf"m={m}.*n=4"):
    downsampling.select_rollouts("max_variance", jnp.zeros((2, 4)), m)


def test_other_errors():
  with pytest.raises(ValueError, match="rng"):
    downsampling.select_rollouts("random", jnp.zeros((2, 4)), 2)
  with pytest.raises(ValueError, match="'nope'"):
    downsampling.select_rollouts("nope", jnp.zeros((2, 4)), 2)
  with pytest.raises(ValueError, match=r"\[G, N\]"):
    downsampling.select_rollouts("max_reward", jnp.zeros((4,)), 2)


def test_gather_groups():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 5))
  tokens = rng.integers(0, 100, size=(3, 5, 7))
  idx = np.array([[0, 2], [1, 4], [3, 4]], np.int32)
  gx, gt = downsampling.gather_groups(jnp.asarray(x), jnp.asarray(tokens), jnp.asarray(idx))
  rows = np.arange(3)[:, None]
  np.testing.assert_allclose(gx, x[rows, idx], rtol=1e-6)
  np.testing.assert_array_equal(gt, tokens[rows, idx])
  single = downsampling.gather_groups(jnp.asarray(tokens), indices_GM=jnp.asarray(idx))
  np.testing.assert_array_equal(single, tokens[rows, idx])
  with pytest.raises(ValueError, match="G=3"):
    downsampling.gather_groups(jnp.zeros((2, 5)), jnp.asarray(idx))
  with pytest.raises(TypeError):
    downsampling.gather_groups(jnp.asarray(idx))


def test_decoupled_baseline_composition():
  # Baseline from all n rollouts, update on the selected m: advantages gathered.
  rewards = np.array([[1.0, 0, 0, 0, 1, 0, 0, 0]])
  idx = downsampling.select_rollouts("max_variance", rewards, 4)
  full = downsampling.gather_groups(advantages.compute_advantages("grpo", rewards), idx)
  mean, std = rewards.mean(), rewards.std()
  expected = (rewards[0, np.asarray(idx[0])] - mean) / (std + 1e-6)
  np.testing.assert_allclose(full[0], expected, rtol=1e-5)
