"""The seeds a slope claim needs: the normal power formula against a simulated test."""

import numpy as np
import pytest

from isojax.planner import power

LOG2_NS = (1, 2, 3, 4, 5)  # n = 2 .. 32


def test_slope_se_by_hand():
  # sum (x - 3)^2 over 1..5 = 10; 3 seeds: sd / sqrt(30).
  assert power.slope_se(0.03, LOG2_NS, 3) == pytest.approx(0.03 / np.sqrt(30))


@pytest.mark.parametrize("effect,seeds", [(0.01, 3), (0.02, 2), (0.0, 4)])
def test_power_matches_a_simulated_slope_test(effect, seeds):
  """Finals a + effect * x + N(0, sd^2), the least-squares slope divided by its known
  standard error against z at alpha / (2 * 3): the fraction decided over 20,000
  simulated sweeps equals the formula's power (at effect 0, the level alpha / 3)."""
  sd, reps = 0.03, 20000
  rng = np.random.default_rng(0)
  x = np.repeat(np.asarray(LOG2_NS, float), seeds)
  y = 0.2 + effect * x + rng.normal(0, sd, (reps, x.size))
  dx = x - x.mean()
  slopes = (y - y.mean(axis=1, keepdims=True)) @ dx / (dx @ dx)
  z = 2.1280452  # Phi^-1(1 - 0.10 / 6)
  decided = np.mean(np.abs(slopes) / power.slope_se(sd, LOG2_NS, seeds) > z)
  expected = power.slope_power(sd, effect, LOG2_NS, seeds)
  assert decided == pytest.approx(expected, abs=0.012)
  if effect == 0:
    assert expected == pytest.approx(0.10 / 3, rel=1e-6)


def test_seeds_for_slope_is_the_fewest_that_reach_the_power():
  k = power.seeds_for_slope(0.03, 0.01, LOG2_NS)
  assert power.slope_power(0.03, 0.01, LOG2_NS, k) >= 0.8
  assert power.slope_power(0.03, 0.01, LOG2_NS, k - 1) < 0.8
  assert power.seeds_for_slope(0.03, 1e-5, LOG2_NS, max_seeds=50) is None
  with pytest.raises(ValueError, match="two or more distinct n"):
    power.slope_se(0.03, (3, 3), 2)


def test_detectable_slope_by_hand():
  """sd 0.03, 3 seeds at n = 2 .. 32: se = 0.03 / sqrt(30); Holm's first step in a family
  of 4 at 0.10 needs |effect| / se above z = Phi^-1(1 - 0.0125) = 2.24140, and 80% power
  adds Phi^-1(0.8) = 0.84162 (the far tail, Phi(-5.3), is negligible)."""
  expected = (2.2414027 + 0.8416212) * 0.03 / np.sqrt(30)
  assert power.detectable_slope(0.03, LOG2_NS, 3, family=4) == pytest.approx(expected,
                                                                             rel=1e-6)
  # More seeds detect less, in proportion to 1 / sqrt(seeds).
  assert power.detectable_slope(0.03, LOG2_NS, 12, family=4) == pytest.approx(expected / 2,
                                                                              rel=1e-6)
