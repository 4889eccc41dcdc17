"""Claim 1's statistic: how far n*, the best number of rollouts per problem, rises over
the compute frontier of an iso-compute sweep.

n* is read from the sweep's sigmoid fits (`analysis.analyze_metric`) at two points fixed
by a rule (`claim1_points`), not at the frontier's first and last points: where every
fit is near its start value and n* flips between neighbours, or where the last point is
an argmax among near-ties. Near-ties count together (`n_star_centre`), and an n* that
reaches the largest n swept is censored: saturation is then not observed.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from isojax.planner import analysis
from isojax.planner import records
from isojax.planner import sigmoid_fit
from isojax.planner import verdicts


# Claim 1 compares n* at two fixed points of the compute range every allocation
# covers: its end, and this many doublings of compute before it (or the range's start).
CLAIM1_SPAN_DOUBLINGS = 4


def claim1_points(c_end: float, c_first: float) -> tuple[float, float]:
  """(C_start, C_end) at which claim 1 compares n*: the end of the compute range every
  allocation covers, and `CLAIM1_SPAN_DOUBLINGS` doublings of compute before it, or the
  range's start (`c_first`, the largest first evaluation at compute > 0) when later."""
  return max(c_end / 2.0 ** CLAIM1_SPAN_DOUBLINGS, c_first), c_end


def n_star_centre(fits_by_n: Mapping[int, Sequence[sigmoid_fit.SigmoidFit]], compute: float,
                  margin: float) -> tuple[float, bool]:
  """(log2 n*, censored) at `compute`: the mean log2 n of the values of n whose best
  fitted value (over B_p) lies within `margin` of the best, so near-ties give the
  middle of the tied range rather than an argmax among them; censored when the largest
  n swept is among them (the best n may lie beyond the grid)."""
  best_n = {n: max(float(f.predict(compute)) for f in fits) for n, fits in fits_by_n.items()}
  top = max(best_n.values())
  near = [n for n, v in best_n.items() if v >= top - margin]
  return float(np.mean(np.log2(near))), max(fits_by_n) in near


def n_star_at_claim1_points(fits_by_n: Mapping[int, Sequence[sigmoid_fit.SigmoidFit]],
                            c_end: float, c_first: float, margin: float
                            ) -> tuple[float, float, bool]:
  """(log2 n* at C_start, log2 n* at C_end, censored at C_end), at `claim1_points`."""
  c_start, c_end = claim1_points(c_end, c_first)
  start, _ = n_star_centre(fits_by_n, c_start, margin)
  end, censored = n_star_centre(fits_by_n, c_end, margin)
  return start, end, censored


def frontier_stats(curves: Sequence[records.RunCurve], metric: str,
                   margin: float = verdicts.EQUIVALENCE_MARGIN) -> dict[str, float]:
  """Claim 1 by a fixed rule: n* (`n_star_centre`) at the two points of
  `claim1_points` (C_end: the smallest last evaluation over allocations); the rise is
  the difference in doublings.
  n_star_censored is 1 when n* at the end includes the largest n swept (saturation
  then is not observed), and log2_n_saturation the fitted law's (bounded by the grid).
  All NaN when no fit rises significantly (no n is best, and a tie read as "no rise"
  would be a verdict the data cannot give)."""
  nan = float("nan")
  empty = dict(log2_n_star_start=nan, log2_n_star_end=nan, n_star_rise=nan,
               n_star_censored=nan, log2_n_saturation=nan)
  try:
    result = analysis.analyze_metric(curves, metric, analysis.Options(metric=metric),
                                     groups=False)
  except ValueError:
    return empty
  fitted = result.curve_fits
  if not fitted or all(f.fit.flat for f in fitted):
    return empty
  fits_by_n: dict[int, list[sigmoid_fit.SigmoidFit]] = {}
  for cf in fitted:
    fits_by_n.setdefault(cf.curve.rollouts_per_problem, []).append(cf.fit)
  start, end, censored = n_star_at_claim1_points(
      fits_by_n, min(cf.max_compute for cf in fitted),
      max(float(cf.compute_E.min()) for cf in fitted), margin)
  return dict(log2_n_star_start=start, log2_n_star_end=end, n_star_rise=end - start,
              n_star_censored=float(censored),
              log2_n_saturation=result.law.log2_n_high if result.law else nan)
