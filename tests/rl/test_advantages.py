"""Advantage estimators against hand-computed cases and NumPy formulas."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from isojax.rl import advantages

EPS = 1e-6


def np_grpo(r, eps=EPS):
  r = np.asarray(r, np.float64)
  return (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=0, keepdims=True) + eps)


def np_drgrpo(r, eps=EPS):
  r = np.asarray(r, np.float64)
  return r - r.mean(1, keepdims=True)


def np_batch_norm(r, eps=EPS):
  c = np_drgrpo(r)
  return c / (np.sqrt(np.mean((c - c.mean()) ** 2)) + eps)


def np_rloo(r, eps=EPS):
  r = np.asarray(r, np.float64)
  out = np.zeros_like(r)
  for g in range(r.shape[0]):
    for i in range(r.shape[1]):
      others = np.delete(r[g], i)
      out[g, i] = r[g, i] - others.mean()
  return out


REFERENCES = {"grpo": np_grpo, "drgrpo": np_drgrpo, "batch_norm": np_batch_norm,
              "rloo": np_rloo}


def test_registry_matches_references():
  assert set(advantages.ADVANTAGE_ESTIMATORS) == set(REFERENCES)


@pytest.mark.parametrize("name, expected", [
    ("grpo", [1.0, -1.0, -1.0, 1.0]),
    ("drgrpo", [0.5, -0.5, -0.5, 0.5]),
    ("rloo", [2 / 3, -2 / 3, -2 / 3, 2 / 3]),
    # One group: batch std of the centred values is the group std, 0.5.
    ("batch_norm", [1.0, -1.0, -1.0, 1.0]),
])
def test_hand_computed_half_solved_group(name, expected):
  out = advantages.compute_advantages(name, jnp.array([[1, 0, 0, 1]]))
  np.testing.assert_allclose(out[0], expected, atol=1e-5)


def test_hand_computed_grpo_and_rloo_one_of_four():
  r = jnp.array([[1.0, 0.0, 0.0, 0.0]])
  # mean 0.25, population std sqrt(0.1875) = 0.4330127.
  np.testing.assert_allclose(advantages.compute_advantages("grpo", r)[0],
                             [1.7320508, -0.5773503, -0.5773503, -0.5773503], atol=1e-5)
  np.testing.assert_allclose(advantages.compute_advantages("rloo", r)[0],
                             [1.0, -1 / 3, -1 / 3, -1 / 3], atol=1e-6)


def test_hand_computed_batch_norm_uses_the_whole_batch():
  # Centred: [[.5, -.5], [0, 0]]; batch std = sqrt(0.5 / 4) = 0.35355.
  out = advantages.compute_advantages("batch_norm", jnp.array([[1.0, 0.0], [1.0, 1.0]]))
  np.testing.assert_allclose(out, [[np.sqrt(2), -np.sqrt(2)], [0, 0]], atol=1e-5)


def test_zero_variance_group_gets_zero_advantage():
  r = jnp.array([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
  for name in advantages.ADVANTAGE_ESTIMATORS:
    out = advantages.compute_advantages(name, r)
    assert np.all(np.isfinite(out)) and np.allclose(out, 0), name


# Rewards on a 0.1 grid: distinct values differ by >= 0.1, so the float32 result is
# well conditioned; covers 0/1 rewards and graded ones, with ties.
rewards_strategy = st.tuples(st.integers(1, 4), st.integers(2, 7)).flatmap(
    lambda shape: hnp.arrays(np.int64, shape, elements=st.integers(0, 10))).map(
        lambda a: a / 10.0)


@settings(max_examples=25, deadline=None)
@given(rewards=rewards_strategy, name=st.sampled_from(sorted(REFERENCES)))
def test_matches_numpy_reference(rewards, name):
  out = advantages.compute_advantages(name, jnp.asarray(rewards, jnp.float32))
  assert out.dtype == jnp.float32 and out.shape == rewards.shape
  np.testing.assert_allclose(out, REFERENCES[name](rewards), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_matches_numpy_reference_continuous_and_jitted(name):
  rewards = np.random.default_rng(0).normal(size=(5, 6))
  fn = jax.jit(functools.partial(advantages.compute_advantages, name, eps=1e-3))
  out = fn(jnp.asarray(rewards, jnp.float32))
  np.testing.assert_allclose(out, REFERENCES[name](rewards, eps=1e-3), rtol=1e-4, atol=1e-5)


def test_integer_rewards_give_float32():
  out = advantages.compute_advantages("drgrpo", jnp.array([[1, 0]], jnp.int32))
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, [[0.5, -0.5]])


def test_errors():
  with pytest.raises(ValueError, match="'nope'.*grpo"):
    advantages.compute_advantages("nope", jnp.zeros((2, 2)))
  with pytest.raises(ValueError, match="n=1"):
    advantages.compute_advantages("rloo", jnp.zeros((3, 1)))
  with pytest.raises(ValueError, match=r"\[G, N\]"):
    advantages.compute_advantages("grpo", jnp.zeros((4,)))


@settings(max_examples=30, deadline=None)
@given(rewards=rewards_strategy)
def test_zero_variance_groups_matches_numpy(rewards):
  out = advantages.zero_variance_groups(jnp.asarray(rewards))
  expected = np.array([len(set(row)) == 1 for row in rewards])
  assert out.dtype == jnp.bool_
  np.testing.assert_array_equal(out, expected)


def test_zero_variance_groups_hand_computed():
  r = jnp.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [0.5, 0.5, 0.5]])
  np.testing.assert_array_equal(advantages.zero_variance_groups(r), [True, False, True, True])


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_constant_groups_with_inexact_mean_give_exact_zero(name):
  # mean([0.1] * 3) is not exactly 0.1 in float32; the residue must not be amplified
  # by the std division into a spurious advantage.
  r = jnp.full((2, 3), 0.1, jnp.float32)
  np.testing.assert_array_equal(advantages.compute_advantages(name, r), np.zeros((2, 3)))


# ==================== Unequal groups: padded to the largest, with a mask ====

def _ragged_reference(name, groups):
  """Each estimator on a list of groups of their own sizes (NumPy, one group at a time;
  batch_norm's std over every reward of every group)."""
  if name == "batch_norm":
    centred = [np_drgrpo(np.asarray(g)[None])[0] for g in groups]
    flat = np.concatenate(centred)
    return [c / (flat.std() + EPS) for c in centred]
  if name == "rloo":
    return [np_rloo(np.asarray(g)[None])[0] if len(g) > 1 else np.zeros(1)
            for g in groups]
  return [REFERENCES[name](np.asarray(g)[None])[0] for g in groups]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
       binary=st.booleans(), seed=st.integers(0, 2 ** 31 - 1),
       name=st.sampled_from(sorted(REFERENCES)))
def test_unequal_groups_match_each_groups_own_statistics(sizes, binary, seed, name):
  """Padding (filled with noise here) changes no real entry and gets advantage 0."""
  rng = np.random.default_rng(seed)
  groups = [(rng.integers(0, 2, k) if binary else rng.normal(size=k)).astype(np.float64)
            for k in sizes]
  n = max(sizes)
  valid = np.arange(n)[None] < np.asarray(sizes)[:, None]
  padded = rng.normal(size=(len(sizes), n)) * 7
  padded[valid] = np.concatenate(groups)
  got = np.asarray(advantages.compute_advantages(name, padded.astype(np.float32),
                                                 valid_GN=valid))
  np.testing.assert_allclose(got[valid], np.concatenate(_ragged_reference(name, groups)),
                             rtol=1e-4, atol=1e-4)
  assert np.all(got[~valid] == 0)
  zero_var = np.asarray(advantages.zero_variance_groups(padded.astype(np.float32), valid))
  np.testing.assert_array_equal(zero_var, [len(set(g.tolist())) == 1 for g in groups])


def test_unequal_groups_hand_computed():
  """Groups [1, 0, 0] and [1] padded to 3: GRPO gives (2/3, -1/3, -1/3) / std(0.4714)
  and 0 to the lone rollout (a constant group) and to the padding."""
  rewards = np.array([[1, 0, 0], [1, 5, 5]], np.float32)
  valid = np.array([[True, True, True], [True, False, False]])
  got = np.asarray(advantages.grpo(rewards, valid_GN=valid))
  std = np.sqrt(2) / 3
  np.testing.assert_allclose(got, [[2 / 3 / std, -1 / 3 / std, -1 / 3 / std], [0, 0, 0]],
                             rtol=1e-5)
  # RLOO of [1, 0, 0]: 1 - 0 = 1 and 0 - 0.5 = -0.5.
  np.testing.assert_allclose(np.asarray(advantages.rloo(rewards, valid_GN=valid)),
                             [[1, -0.5, -0.5], [0, 0, 0]], rtol=1e-5)
  with pytest.raises(ValueError, match=r"valid_GN has shape \(2, 2\)"):
    advantages.grpo(rewards, valid_GN=valid[:, :2])
