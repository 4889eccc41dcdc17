"""Monotone sigmoid fits of a metric against compute (the ScaleRL form).

    R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B)

A is the asymptote, B the efficiency exponent, C_mid the compute at half the gain
and R0 the value at C = 0, as the IsoCompute paper fits them. The curve is a logistic
function of log C, so the same fit serves the metric-vs-compute curves and the law
log2 n*(C) (see `frontier.py`).

Why this fitter and not a plain `curve_fit`: sweep curves are short (a handful of
evaluations), noisy, and often flat or far from saturation, where a
four-parameter least squares from a fixed guess wanders off or fails. We use
*variable projection*: for fixed (B, C_mid) the model is linear in (R0, A), so a
vectorised grid over (B, C_mid) with closed-form (R0, A) finds the basin of the
global optimum, and a bounded `scipy.optimize.least_squares` then refines all
parameters with an analytic Jacobian. The gain A - R0 is kept >= 0 (a monotone
non-decreasing curve) and B, C_mid stay in bounds, so every input gets a defined,
finite answer. The standard error of A comes from the Jacobian at the optimum;
`bootstrap_asymptote` gives a residual-bootstrap alternative.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats

# Bounds on the efficiency exponent B; curves in the papers have B in ~[0.5, 3].
B_BOUNDS = (0.1, 10.0)
# C_mid may lie this factor outside the observed compute range (far-from-saturation
# curves put it beyond the last evaluation).
C_MID_MARGIN = 100.0
_B_GRID = np.geomspace(*B_BOUNDS, 17)  # the b values the grid tries
_NUM_C_MID_GRID = 33
MIN_POINTS = 3
# A rise is kept only if it beats the flat model at this F-test level; otherwise
# the free (B, C_mid) fit noise (e.g. a huge A whose rise starts after the data).
FLAT_TEST_LEVEL = 0.05


def sigmoid(compute, r0: float, a: float, b: float, c_mid: float) -> np.ndarray:
  """R(C) of the ScaleRL form; R(0) = R0. `compute` is any-shaped, >= 0."""
  c = np.asarray(compute, np.float64)
  return r0 + (a - r0) * _gain_fraction(c, b, c_mid)


def _gain_fraction(c, b, c_mid):
  """1 / (1 + (c_mid / c)^b), computed stably in log space; 0 at c = 0."""
  with np.errstate(divide="ignore"):
    z = b * (np.log(np.maximum(c, 0.0)) - np.log(c_mid))
  return 0.5 * (1.0 + np.tanh(0.5 * z))  # the logistic function, overflow-free


@dataclasses.dataclass(frozen=True)
class SigmoidFit:
  """A fitted R(C) curve and how well it is determined."""
  r0: float
  a: float
  b: float
  c_mid: float
  a_stderr: float          # standard error of A (Jacobian); inf when undetermined
  rmse: float              # root mean squared residual on the fitted points
  num_points: int
  compute_range: tuple[float, float]  # (min, max) compute of the fitted points
  r0_fixed: bool
  flat: bool = False       # no significant rise: A = R0 = the flat level

  def predict(self, compute) -> np.ndarray:
    return sigmoid(compute, self.r0, self.a, self.b, self.c_mid)

  def compute_at_fraction(self, fraction: float) -> float:
    """The C at which the curve has covered `fraction` of its gain A - R0."""
    if not 0 < fraction < 1:
      raise ValueError(f"fraction={fraction}: expected in (0, 1)")
    return self.c_mid * (fraction / (1 - fraction)) ** (1 / self.b)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["compute_range"] = list(self.compute_range)
    d["a_stderr"] = self.a_stderr if math.isfinite(self.a_stderr) else None
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "SigmoidFit":
    d = dict(d)
    d["compute_range"] = tuple(d["compute_range"])
    d["a_stderr"] = math.inf if d["a_stderr"] is None else d["a_stderr"]
    return cls(**d)


def _check_inputs(compute_E, values_E):
  c = np.asarray(compute_E, np.float64).ravel()
  r = np.asarray(values_E, np.float64).ravel()
  if c.shape != r.shape:
    raise ValueError(f"compute has {c.size} points but values has {r.size}")
  if not (np.all(np.isfinite(c)) and np.all(np.isfinite(r))):
    raise ValueError("compute and values must be finite")
  if np.any(c < 0):
    raise ValueError("compute must be >= 0")
  if np.count_nonzero(c > 0) < MIN_POINTS:
    raise ValueError(
        f"need at least {MIN_POINTS} evaluations at compute > 0 to fit a sigmoid, "
        f"got {np.count_nonzero(c > 0)}")
  return c, r


def _grid_init(c_E, r_E, r0, lower, upper, c_mid_grid):
  """Best (r0, a, b, c_mid) over the (B, C_mid) grid with closed-form (R0, A)."""
  b_A = np.repeat(_B_GRID, c_mid_grid.size)
  cm_A = np.tile(c_mid_grid, _B_GRID.size)
  s_AE = _gain_fraction(c_E[None, :], b_A[:, None], cm_A[:, None])
  if r0 is not None:
    y_E = r_E - r0
    ss = np.einsum("ae,ae->a", s_AE, s_AE)
    gain_A = np.einsum("ae,e->a", s_AE, y_E) / np.maximum(ss, 1e-300)
    gain_A = np.clip(gain_A, 0.0, max(upper - r0, 0.0))
    r0_A = np.full_like(gain_A, r0)
  else:
    # Normal equations of r = r0 * (1 - s) + a * s, per grid cell.
    u_AE = 1.0 - s_AE
    uu, us, ss = (np.einsum("ae,ae->a", x, y) for x, y in
                  ((u_AE, u_AE), (u_AE, s_AE), (s_AE, s_AE)))
    uy, sy = u_AE @ r_E, s_AE @ r_E
    det = uu * ss - us * us
    ok = det > 1e-12 * np.maximum(uu * ss, 1e-300)
    safe = np.where(ok, det, 1.0)
    r0_A = np.where(ok, (ss * uy - us * sy) / safe, r_E.mean())
    a_A = np.where(ok, (uu * sy - us * uy) / safe, r_E.mean())
    decreasing = a_A < r0_A  # the best monotone fit is then the constant mean
    r0_A = np.clip(np.where(decreasing, r_E.mean(), r0_A), lower, upper)
    gain_A = np.clip(np.where(decreasing, 0.0, a_A - r0_A), 0.0, upper - r0_A)
  resid_AE = r0_A[:, None] + gain_A[:, None] * s_AE - r_E[None, :]
  best = int(np.argmin(np.einsum("ae,ae->a", resid_AE, resid_AE)))
  return r0_A[best], gain_A[best], b_A[best], cm_A[best]


def _model_and_jacobian(theta, c_E, r0_fixed, upper):
  """Residual model and its Jacobian. With R0 given, the parameters are (gain, log b,
  log c_mid) and A = R0 + gain; with R0 free, (R0, f, log b, log c_mid) and
  A = R0 + f * (upper - R0), f in [0, 1], so both R0 and A stay within the bounds (a
  box on (R0, gain) would let A reach R0 + upper - lower)."""
  if r0_fixed is None:
    r0, frac, log_b, log_cm = theta
    gain = frac * (upper - r0)
  else:
    r0, (gain, log_b, log_cm) = r0_fixed, theta
  b = math.exp(log_b)
  with np.errstate(divide="ignore"):
    dlog_E = np.log(c_E) - log_cm
  s_E = _gain_fraction(c_E, b, math.exp(log_cm))
  ds_E = np.where(c_E > 0, s_E * (1 - s_E), 0.0)
  dlog_E = np.where(c_E > 0, dlog_E, 0.0)
  shape = [gain * ds_E * b * dlog_E, -gain * ds_E * b]
  if r0_fixed is None:
    columns = [1.0 - frac * s_E, (upper - r0) * s_E] + shape
  else:
    columns = [s_E] + shape
  return r0 + gain * s_E, np.stack(columns, axis=1)


def fit_sigmoid(compute_E, values_E, *, r0: float | None = None,
                lower: float = -np.inf, upper: float = np.inf) -> SigmoidFit:
  """Least-squares monotone sigmoid through (compute_E, values_E), [E] each.

  Args:
    compute_E: compute of each evaluation (rollouts, tokens or steps), >= 0.
    values_E: the metric at each evaluation.
    r0: the value at C = 0 when known (e.g. the base model's score shared by all
      runs of a sweep); None fits it (then at least 4 points pin all parameters,
      3 still give a bounded, defined answer).
    lower, upper: bounds on R0 and A (e.g. 0 and 1 for accuracies).

  Returns:
    A SigmoidFit with A >= R0, B in B_BOUNDS and C_mid within C_MID_MARGIN of
    the observed compute range.
  """
  c_E, r_E = _check_inputs(compute_E, values_E)
  if r0 is not None and not lower <= r0 <= upper:
    raise ValueError(f"r0={r0} lies outside [lower={lower}, upper={upper}]")
  if not lower <= upper:
    raise ValueError(f"lower={lower} > upper={upper}")
  c_pos = c_E[c_E > 0]
  c_lo, c_hi = float(c_pos.min()), float(c_E.max())
  if lower == upper:  # nothing to fit: the curve is pinned to one level
    return _flat_fit(c_E, r_E, lower, lower, upper, (c_lo, c_hi))
  cm_lo, cm_hi = c_lo / C_MID_MARGIN, c_hi * C_MID_MARGIN
  c_mid_grid = np.geomspace(cm_lo, cm_hi, _NUM_C_MID_GRID)
  # Finite stand-ins for infinite bounds keep the grid's clipping well defined.
  span = float(np.ptp(r_E)) + 1.0
  lo = lower if math.isfinite(lower) else float(r_E.min()) - 10 * span
  hi = upper if math.isfinite(upper) else float(r_E.max()) + 10 * span
  r0_init, gain, b, c_mid = _grid_init(c_E, r_E, r0, lo, hi, c_mid_grid)

  free_r0 = r0 is None
  shape0, shape_lb = [math.log(b), math.log(c_mid)], [math.log(B_BOUNDS[0]), math.log(cm_lo)]
  shape_ub = [math.log(B_BOUNDS[1]), math.log(cm_hi)]
  if free_r0:
    frac0 = gain / (hi - r0_init) if hi > r0_init else 0.0
    x0, lb, ub = [r0_init, frac0] + shape0, [lo, 0.0] + shape_lb, [hi, 1.0] + shape_ub
  else:
    x0, lb, ub = [gain] + shape0, [0.0] + shape_lb, [max(hi - r0, 1e-12)] + shape_ub
  x0 = np.clip(x0, lb, ub)
  fixed = None if free_r0 else r0

  def residuals(theta):
    return _model_and_jacobian(theta, c_E, fixed, hi)[0] - r_E

  def jacobian(theta):
    return _model_and_jacobian(theta, c_E, fixed, hi)[1]

  result = optimize.least_squares(residuals, x0, jac=jacobian, bounds=(lb, ub),
                                  method="trf", x_scale="jac", max_nfev=200)
  theta = result.x
  log_b, log_cm = (float(x) for x in theta[-2:])
  if free_r0:
    fit_r0, frac = float(theta[0]), float(theta[1])
    gain, grad_a = frac * (hi - fit_r0), [1.0 - frac, hi - fit_r0, 0.0, 0.0]
  else:
    fit_r0, gain, grad_a = float(r0), float(theta[0]), [1.0, 0.0, 0.0]
  resid_E = result.fun
  fit = SigmoidFit(
      r0=fit_r0, a=fit_r0 + gain, b=math.exp(log_b), c_mid=math.exp(log_cm),
      a_stderr=_asymptote_stderr(result.jac, resid_E, grad_a),
      rmse=float(np.sqrt(np.mean(resid_E ** 2))), num_points=int(c_E.size),
      compute_range=(c_lo, c_hi), r0_fixed=not free_r0)
  flat = _flat_fit(c_E, r_E, r0, lo, hi, (c_lo, c_hi))
  if _rise_is_significant(float(resid_E @ resid_E), flat, c_E.size, len(theta)):
    return fit
  return flat


def _flat_fit(c_E, r_E, r0, lo, hi, compute_range) -> SigmoidFit:
  """The constant model: R = R0 (given) or R = clip(mean) (free R0)."""
  level = float(r0) if r0 is not None else float(np.clip(r_E.mean(), lo, hi))
  resid_E = r_E - level
  num_points = r_E.size
  spread = float(np.sqrt(resid_E @ resid_E / max(num_points - 1, 1)))
  return SigmoidFit(
      r0=level, a=level, b=1.0, c_mid=float(np.sqrt(compute_range[0] * compute_range[1])),
      a_stderr=spread / math.sqrt(num_points) if num_points > 1 else math.inf,
      rmse=float(np.sqrt(np.mean(resid_E ** 2))), num_points=int(num_points),
      compute_range=compute_range, r0_fixed=r0 is not None, flat=True)


def _rise_is_significant(sse: float, flat: SigmoidFit, num_points: int,
                         num_params: int) -> bool:
  """F-test of the sigmoid against the flat model nested in it."""
  sse_flat = flat.rmse ** 2 * num_points
  extra = num_params - (0 if flat.r0_fixed else 1)
  dof = num_points - num_params
  if dof <= 0:
    return sse < sse_flat  # too few points to test: keep any improvement
  if sse <= 1e-30 * max(sse_flat, 1e-300):
    return sse_flat > 0
  f_stat = ((sse_flat - sse) / extra) / (sse / dof)
  return f_stat > stats.f.ppf(1 - FLAT_TEST_LEVEL, extra, dof)


def _asymptote_stderr(jacobian, resid_E, grad_a) -> float:
  """Standard error of A from sigma^2 (J^T J)^+ at the optimum; `jacobian` is J,
  [E, number of parameters], and `grad_a` is dA / d(parameters)."""
  num_points, num_params = jacobian.shape
  dof = num_points - num_params
  if dof <= 0:
    return math.inf
  sigma2 = float(resid_E @ resid_E) / dof
  cov = np.linalg.pinv(jacobian.T @ jacobian) * sigma2
  grad = np.asarray(grad_a, np.float64)
  var = float(grad @ cov @ grad)
  return math.sqrt(var) if var >= 0 and math.isfinite(var) else math.inf


def bootstrap_asymptote(compute_E, values_E, fit: SigmoidFit, *, num_resamples: int = 200,
                        seed: int = 0, lower: float = -np.inf,
                        upper: float = np.inf) -> dict[str, float]:
  """Residual bootstrap of A: refits on fit + resampled residuals.

  Returns {'a_stderr', 'a_low', 'a_high'}: the bootstrap standard deviation of A
  and its 2.5% / 97.5% percentiles. Deterministic for a given seed.
  """
  c_E, r_E = _check_inputs(compute_E, values_E)
  pred_E = fit.predict(c_E)
  resid_E = r_E - pred_E
  rng = np.random.default_rng(seed)
  a_Z = np.empty(num_resamples)
  for i in range(num_resamples):
    sample_E = pred_E + rng.choice(resid_E, size=resid_E.size, replace=True)
    refit = fit_sigmoid(c_E, sample_E, r0=fit.r0 if fit.r0_fixed else None,
                        lower=lower, upper=upper)
    a_Z[i] = refit.a
  low, high = np.percentile(a_Z, [2.5, 97.5])
  return {"a_stderr": float(a_Z.std(ddof=1)), "a_low": float(low), "a_high": float(high)}


def extrapolation_check(compute_E, values_E, *, fraction: float = 0.5,
                        r0: float | None = None, lower: float = -np.inf,
                        upper: float = np.inf, tail: int = 3) -> dict[str, Any]:
  """Fits on compute <= fraction * C_max and predicts the metric strictly after it.

  One evaluation is as noisy as the run, so both sides average the last `tail`
  evaluations that lie after the fit window (fewer when fewer do): `observed` is their
  mean metric, `predicted` the mean of the early fit at their compute, `error` =
  predicted - observed. `persistence` is the baseline a fit must beat: the last value
  inside the window carried forward, with its own `persistence_error`. Raises ValueError
  when the early part has too few points to fit or no evaluation lies after it.
  """
  c_E, r_E = _check_inputs(compute_E, values_E)
  order = np.argsort(c_E, kind="stable")
  c_E, r_E = c_E[order], r_E[order]
  c_max = float(c_E[-1])
  early = c_E <= fraction * c_max
  late = np.flatnonzero(~early)[-tail:]
  if late.size == 0:
    raise ValueError(f"no evaluation after the fit window (compute <= {fraction} * {c_max:g})")
  fit = fit_sigmoid(c_E[early], r_E[early], r0=r0, lower=lower, upper=upper)
  predicted = float(fit.predict(c_E[late]).mean())
  observed = float(r_E[late].mean())
  persistence = float(r_E[early][-1])
  return {
      "fit_max_rollouts": float(c_E[early].max()),
      "target_rollouts": c_max,
      "observed_rollouts": [float(c) for c in c_E[late]],
      "predicted": predicted,
      "observed": observed,
      "error": predicted - observed,
      "persistence": persistence,
      "persistence_error": persistence - observed,
      "fit": fit.to_dict(),
  }
