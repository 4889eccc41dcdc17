"""Claim 10's statistic: compute to the uniform frontier's best value, per-problem over
uniform, on curves whose answer is known."""

import math

import numpy as np
import pytest

from isojax.planner import findings, records, time_to_value


def _curve(n, values, seed=0, c_end=1024.0):
  c_E = np.linspace(0.0, c_end, len(values))
  return records.RunCurve(f"n{n}_s{seed}", 8, n, c_E, np.asarray(values, float))


def test_a_curve_twice_as_fast_halves_the_compute():
  """Uniform n = 4 rises linearly to 0.5 at C = 1024 (its last two evaluations, 0.4375
  and 0.5, average 0.46875: the target, first reached at 1024); per-problem rises twice
  as fast and first reaches it at 512 rollouts: log2 ratio -1."""
  x = np.linspace(0, 1, 9)
  uniform = [_curve(4, 0.5 * x), _curve(8, 0.3 * x)]
  per_problem = [_curve(4, np.minimum(1.0 * x, 0.6)), _curve(8, 0.2 * x)]
  got = time_to_value.per_problem_stats(uniform, per_problem, tail=2)
  assert got["uniform_best"] == pytest.approx((0.5 * 0.875 + 0.5) / 2)
  # Per-problem's first evaluation at or above 0.46875 is x = 0.5 (value 0.5): 512.
  assert got["log2_compute_ratio"] == pytest.approx(math.log2(512 / 1024))
  assert got["reached"] == 1.0 and got["per_problem_best"] == pytest.approx(0.6)


def test_seeds_are_averaged_and_a_target_never_reached_is_a_lower_bound():
  """Two seeds of uniform n = 4 (0.4 and 0.6 at the end: mean 0.5); per-problem tops out
  at 0.3: never reached, its largest compute stands in (log2 1 = 0) and reached is 0."""
  x = np.linspace(0, 1, 5)
  uniform = [_curve(4, 0.4 * x, seed=0), _curve(4, 0.6 * x, seed=1)]
  per_problem = [_curve(4, 0.3 * x)]
  got = time_to_value.per_problem_stats(uniform, per_problem, tail=1)
  assert got["uniform_best"] == pytest.approx(0.5)
  assert got["reached"] == 0.0 and got["log2_compute_ratio"] == pytest.approx(0.0)
  with pytest.raises(ValueError, match="different rollouts"):
    time_to_value.allocation_means([_curve(4, x), _curve(4, x, c_end=2048.0)], tail=1)


def test_the_findings_row_of_a_per_problem_experiment():
  effect = lambda v, lo, hi: dict(value=v, lo=lo, hi=hi, samples=list(np.linspace(lo, hi, 99)))
  exp = dict(kind="per_problem", variants=["uniform", "per_problem"], fewest_seeds=3,
             effects=dict(log2_compute_ratio=effect(-0.8, -1.2, -0.4),
                          uniform_best=effect(0.42, 0.4, 0.44),
                          per_problem_best=effect(0.45, 0.43, 0.47),
                          reached=effect(1.0, 1.0, 1.0)),
             details={}, extrapolation={}, frontier_extrapolation={})
  rows = [r for r in findings.raw_table({"per_problem": exp}) if r.finding == "10"]
  assert len(rows) == 1 and rows[0].verdict == "yes"  # the interval lies below 0
  assert "target +0.420; per-problem best +0.450" in rows[0].note
