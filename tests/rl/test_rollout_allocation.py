"""Per-problem rollout allocation: the solver against brute force, the estimator."""

import itertools

import numpy as np
import pytest

from isojax.rl import rollout_allocation as ra


def _objective(p, n):
  return sum(1 - pi ** ni - (1 - pi) ** ni for pi, ni in zip(p, n))


def _brute_force(p, budget, n_min, n_max):
  best = max((n for n in itertools.product(range(n_min, n_max + 1), repeat=len(p))
              if sum(n) == budget), key=lambda n: _objective(p, n))
  return _objective(p, best)


@pytest.mark.parametrize("seed", range(12))
def test_the_split_is_a_brute_force_optimum(seed):
  rng = np.random.default_rng(seed)
  g = int(rng.integers(2, 5))
  p = np.concatenate([rng.uniform(0, 1, g - 1), [rng.choice([0.0, 0.02, 0.5, 1.0])]])
  n_min, n_max = int(rng.integers(1, 3)), int(rng.integers(4, 9))
  budget = int(rng.integers(n_min * g, n_max * g + 1))
  n = ra.allocate(p, budget, n_min, n_max)
  assert n.sum() == budget and n.min() >= n_min and n.max() <= n_max
  assert _objective(p, n) == pytest.approx(_brute_force(p, budget, n_min, n_max), abs=1e-12)


def test_hopeless_and_solved_problems_get_the_minimum():
  """p = 0 and p = 1 never mix: every extra rollout goes to the uncertain problem."""
  n = ra.allocate([0.0, 1.0, 0.4], budget=12, n_min=2, n_max=16)
  assert n.tolist() == [2, 2, 8]


def test_mixed_group_probability_by_hand():
  assert ra.mixed_group_probability(0.5, 2) == pytest.approx(0.5)
  assert ra.mixed_group_probability(0.1, 3) == pytest.approx(1 - 0.001 - 0.729)


def test_the_estimate_is_the_beta_posterior_mean_and_converges():
  """Prior mean 0.2 with strength 4; 30 of 40 correct: (0.8 + 30) / 44, by hand. With
  many rollouts of a known rate the estimate approaches it."""
  got = ra.pass_rate_estimate([30, 0], [40, 0], [0.2, 0.3], 4.0)
  np.testing.assert_allclose(got, [(0.8 + 30) / 44, 0.3])
  rng = np.random.default_rng(0)
  rates = np.array([0.02, 0.3, 0.9])
  trials = np.full(3, 20000)
  est = ra.pass_rate_estimate(rng.binomial(trials, rates), trials, 0.5, 2.0)
  np.testing.assert_allclose(est, rates, atol=0.01)


@pytest.mark.parametrize("call,message", [
    (lambda: ra.allocate([0.5, 0.5], 8, 5, 4), "n_min=5 is above n_max=4"),
    (lambda: ra.allocate([0.5, 0.5], 3, 2, 8), "budget=3 rollouts is below n_min=2"),
    (lambda: ra.allocate([0.5, 0.5], 20, 2, 8), "budget=20 rollouts is above n_max=8"),
    (lambda: ra.allocate([1.5], 4, 2, 8), "pass rates"),
    (lambda: ra.pass_rate_estimate([1], [2], [1.0], 4.0), "expected pass-rate priors in"),
    (lambda: ra.pass_rate_estimate([1], [2], [0.5], 0.0), "prior_strength=0.0"),
    (lambda: ra.pass_rate_estimate([3], [2], [0.5], 1.0), "successes"),
])
def test_bad_input_names_what_is_wrong(call, message):
  with pytest.raises(ValueError, match=message):
    call()


def test_the_profile_counts_as_earlier_rollouts_of_the_problem():
  """A problem profiled at avg@16 = 0.25 (4 of 16) and then 3 of 8 in the run, prior 0.5
  of strength 2: (1 + 4 + 3) / (2 + 16 + 8). An unprofiled one starts at the prior."""
  profile = ra.Profile.of(["a", "b"], {"a": 0.25}, 16, prior_mean=0.5, prior_strength=2.0)
  np.testing.assert_allclose(profile.estimate([0, 1]), [(1 + 4) / 18, 0.5])
  got = profile.estimate([0, 1, 0], successes_G=[3, 1], trials_G=[8, 4])
  np.testing.assert_allclose(got, [(1 + 4 + 3) / 26, (1 + 1) / 6, (1 + 4 + 3) / 26])


def test_a_step_spends_n_a_problem_within_each_call_and_shard():
  """allocation_blocks: 10 problems in calls of 4 (max 4 * 3 rollouts) on 2 shards:
  blocks of 2, the last call's padding left out; each block spends 3 a problem."""
  from isojax.rl import rollout  # pylint: disable=g-import-not-at-top
  blocks = rollout.allocation_blocks(10, 3, 12, 2)
  assert [b.tolist() for b in blocks] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
  p = np.array([0.0, 0.5, 0.9, 0.1, 0.5, 0.5, 1.0, 0.3, 0.05, 0.6])
  for block in blocks:
    sizes = ra.allocate(p[block], 3 * block.size, 2, 8)
    assert sizes.sum() == 3 * block.size
  # Two problems, one at p = 0 and one at 0.5: the one that can vary takes the rest.
  np.testing.assert_array_equal(ra.allocate([0.0, 0.5], 6, 2, 8), [2, 4])
