"""The sweep analysis: run directories in, `analysis.json` out.

This is the IsoCompute paper's workflow as one function of the runs:
record-breaking points per run (the empirical frontier) -> one monotone sigmoid
per allocation (B_p, n) -> the frontier over the fitted curves (jointly over
(B_p, n), per B_p, and per fixed batch B) -> n*(C) and its sigmoid law -> the
extrapolation check (fit on compute up to C/2, predict C). The same is repeated,
without the checks, for the avg@k / best@k / worst@k companions of the chosen metric,
since the paper's n* differs between them (sharpening vs coverage).

`launch.analyze` is a thin flag parser around `analyze_directory` and
`write_analysis`; `docs/planner.md` documents the JSON schema.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Sequence

from absl import logging
import numpy as np

from isojax import metrics
from isojax import run_dir
from isojax import storage
from isojax.planner import frontier
from isojax.planner import records
from isojax.planner import sigmoid_fit

SCHEMA_VERSION = 1
ANALYSIS_FILE = "analysis.json"
_BOUNDED_METRIC = re.compile(r"val/(avg|best|worst)@(\d+)")


class AnalysisError(ValueError):
  """The runs cannot be analysed as asked (no runs, unknown metric, ...)."""


@dataclasses.dataclass(frozen=True)
class Options:
  metric: str = metrics.val_avg(4)
  bin_width: float = records.DEFAULT_BIN_WIDTH  # record-breaking bins, metric units
  # Fit record-breaking points (the paper's literal workflow: records, then fits) instead
  # of every evaluation. Off by default: records ride the top of the noise (A biased up
  # by the noise) and leave only a few points on a plateau, while all points give
  # unbiased fits; the records still define the empirical frontier.
  use_records: bool = False
  grid_points: int = 64             # log-spaced compute values of the frontier
  extrapolation_fraction: float = 0.5
  fit_min_rollouts: float = 0.0     # ignore evaluations before this compute (ScaleRL)
  companions: bool = True           # also analyse avg/best/worst@k


def value_bounds(metric: str) -> tuple[float, float]:
  """(0, 1) for the accuracy-like validation metrics, unbounded otherwise."""
  return (0.0, 1.0) if _BOUNDED_METRIC.fullmatch(metric) else (-math.inf, math.inf)


def companion_metrics(metric: str) -> list[str]:
  """avg@k, best@k, worst@k for the k of `metric` (k = 4 if it names none)."""
  match = re.search(r"@(\d+)$", metric)
  k = int(match.group(1)) if match else 4
  return [metrics.val_avg(k), metrics.val_best(k), metrics.val_worst(k)]


@dataclasses.dataclass(frozen=True)
class CurveFit:
  curve: records.Curve              # every evaluation of the allocation
  compute_E: np.ndarray             # [E] the points the fit used
  values_E: np.ndarray              # [E]
  fit: sigmoid_fit.SigmoidFit

  @property
  def max_compute(self) -> float:
    return float(self.curve.rollouts_E.max())

  @property
  def frontier_limit(self) -> float:
    """How far the curve takes part in the frontier: its last evaluation plus one
    batch, since an iso-compute run floors M and leaves up to a batch of C unspent."""
    return self.max_compute + self.curve.batch_rollouts

  def to_dict(self) -> dict[str, Any]:
    c = self.curve
    return {"problems_per_batch": c.problems_per_batch,
            "rollouts_per_problem": c.rollouts_per_problem,
            "batch_rollouts": c.batch_rollouts, "runs": list(c.paths),
            "max_rollouts": self.max_compute, **self.fit.to_dict()}


@dataclasses.dataclass
class MetricAnalysis:
  """Fits, frontiers and the n* law of one metric."""
  metric: str
  r0: float | None
  curve_fits: list[CurveFit]
  unfitted: list[dict[str, Any]]
  frontier: list[frontier.FrontierPoint]
  empirical_frontier: list[frontier.FrontierPoint]
  law: frontier.NStarLaw | None
  by_problems_per_batch: dict[int, dict[str, Any]]
  fixed_batch: dict[int, dict[str, Any]]

  def to_dict(self) -> dict[str, Any]:
    def points(ps, extra=None):
      return [dict(p.to_dict(self.metric), **(extra(p) if extra else {})) for p in ps]

    def law(x):
      return x.to_dict() if x is not None else None

    main_law = law(self.law)
    if main_law is not None:
      # n* cannot be seen to saturate above the largest n the sweep tried.
      largest = max(cf.curve.rollouts_per_problem for cf in self.curve_fits)
      main_law["largest_swept_n"] = largest
      main_law["censored"] = self.frontier[-1].rollouts_per_problem == largest
    return {
        "metric": self.metric, "r0": self.r0,
        "value_bounds": list(value_bounds(self.metric)),
        "fits": [cf.to_dict() for cf in self.curve_fits],
        "unfitted": self.unfitted,
        "frontier": points(self.frontier),
        "empirical_frontier": points(self.empirical_frontier),
        "n_star_fit": main_law,
        "frontier_by_problems_per_batch": {
            str(b_p): {"frontier": points(g["frontier"]), "n_star_fit": law(g["law"])}
            for b_p, g in self.by_problems_per_batch.items()},
        "fixed_batch": {
            str(b): {"frontier": points(g["frontier"], lambda p, b=b: {
                "num_steps": p.rollouts / b}), "n_star_fit": law(g["law"])}
            for b, g in self.fixed_batch.items()},
    }


def _fit_points(rc_all: records.Curve, rc_records: records.Curve | None,
                min_compute: float):
  """The (compute, value) points to fit: records if enough, else every point."""
  for curve in (rc_records, rc_all):
    if curve is None:
      continue
    keep = (curve.rollouts_E > 0) & (curve.rollouts_E >= min_compute)
    if np.count_nonzero(keep) >= sigmoid_fit.MIN_POINTS:
      return curve.rollouts_E[keep], curve.values_E[keep]
  return None


def _positive(rc: records.RunCurve):
  keep = rc.rollouts_E > 0
  return rc.rollouts_E[keep], rc.values_E[keep]


def analyze_metric(run_curves: Sequence[records.RunCurve], metric: str,
                   options: Options, *, groups: bool = True) -> MetricAnalysis:
  """Fits and frontiers of `metric` from per-run curves (already loaded)."""
  lower, upper = value_bounds(metric)
  r0 = records.initial_value(run_curves)
  if r0 is not None:
    r0 = float(np.clip(r0, lower, upper))
  pooled = records.pool_curves(run_curves)
  pooled_records = {c.key: c for c in records.pool_curves(
      [rc.records(options.bin_width) for rc in run_curves])} if options.use_records else {}

  curve_fits, unfitted = [], []
  for curve in pooled:
    pts = _fit_points(curve, pooled_records.get(curve.key), options.fit_min_rollouts)
    if pts is None:
      reason = f"fewer than {sigmoid_fit.MIN_POINTS} evaluations at compute > 0"
      if options.fit_min_rollouts > 0:
        reason += f" and >= fit_min_rollouts={options.fit_min_rollouts:g}"
      unfitted.append({"problems_per_batch": curve.problems_per_batch,
                       "rollouts_per_problem": curve.rollouts_per_problem, "reason": reason})
      continue
    fit = sigmoid_fit.fit_sigmoid(*pts, r0=r0, lower=lower, upper=upper)
    curve_fits.append(CurveFit(curve, pts[0], pts[1], fit))

  keys = [cf.curve.key for cf in curve_fits]
  fits = [cf.fit for cf in curve_fits]
  max_compute_A = [cf.frontier_limit for cf in curve_fits]
  points, law, by_b_p, fixed_b = [], None, {}, {}
  if curve_fits:
    lo = min(f.compute_range[0] for f in fits)
    hi = max(cf.max_compute for cf in curve_fits)
    grid_E = frontier.compute_grid(lo, hi, options.grid_points)
    points = frontier.fitted_frontier(keys, fits, grid_E, max_compute_A)
    swept_n = [k[1] for k in keys]
    law = frontier.law_from_frontier(points, fits, n_bounds=(min(swept_n), max(swept_n)))
    if groups:
      by_b_p = frontier.group_frontiers(keys, fits, max_compute_A, by="problems_per_batch",
                                        num=options.grid_points)
      fixed_b = frontier.group_frontiers(keys, fits, max_compute_A, by="batch_rollouts",
                                         num=options.grid_points)
  # Record points give the same envelope as all points at bin resolution.
  observed = [(c, v, rc.key) for rc in run_curves
              for c, v in zip(*_positive(rc.records(options.bin_width)))]
  return MetricAnalysis(
      metric=metric, r0=r0, curve_fits=curve_fits, unfitted=unfitted, frontier=points,
      empirical_frontier=frontier.empirical_frontier(observed), law=law,
      by_problems_per_batch=by_b_p, fixed_batch=fixed_b)


def extrapolation(analysis: MetricAnalysis, fraction: float) -> dict[str, Any]:
  """Fit on compute <= fraction * C_max, predict C_max: per curve and for the frontier."""
  lower, upper = value_bounds(analysis.metric)
  per_curve = []
  for cf in analysis.curve_fits:
    entry = {"problems_per_batch": cf.curve.problems_per_batch,
             "rollouts_per_problem": cf.curve.rollouts_per_problem}
    try:
      check = sigmoid_fit.extrapolation_check(cf.compute_E, cf.values_E, fraction=fraction,
                                              r0=analysis.r0, lower=lower, upper=upper)
      del check["fit"]
      entry.update(check)
    except ValueError as e:
      entry["skipped"] = str(e)
    per_curve.append(entry)
  errors = np.array([e["error"] for e in per_curve if "error" in e])
  return {
      "fraction": fraction,
      "num_checked": int(errors.size),
      "mean_abs_error": float(np.abs(errors).mean()) if errors.size else None,
      "max_abs_error": float(np.abs(errors).max()) if errors.size else None,
      "per_curve": per_curve,
      "frontier": _frontier_extrapolation(analysis, fraction, lower, upper),
  }


def _frontier_extrapolation(analysis, fraction, lower, upper):
  """Predict the best value and allocation at the sweep's largest compute.

  Like `sigmoid_fit.extrapolation_check`, both sides average the last three
  evaluations after the fit window of each allocation that reaches the largest
  compute: `observed` is the best such mean, `predicted` the best mean of the early
  fits at the same compute points (comparing a prediction at C_max with a mean over
  evaluations spread out in compute, as log-spaced ones are, would bias the error).
  """
  if not analysis.curve_fits:
    return None
  target = max(cf.max_compute for cf in analysis.curve_fits)
  finishers = [cf for cf in analysis.curve_fits if cf.max_compute >= target * (1 - 1e-9)]
  predicted, observed = [], []
  for cf in finishers:
    early = cf.compute_E <= fraction * target
    late = cf.curve.rollouts_E > fraction * target
    tail_E = cf.curve.rollouts_E[late][-3:]
    observed.append((float(cf.curve.values_E[late][-3:].mean()), cf.curve.key))
    if np.count_nonzero(early) >= sigmoid_fit.MIN_POINTS:
      fit = sigmoid_fit.fit_sigmoid(cf.compute_E[early], cf.values_E[early],
                                    r0=analysis.r0, lower=lower, upper=upper)
      predicted.append((float(fit.predict(tail_E).mean()), cf.curve.key))
  if not predicted:
    return {"skipped": f"no allocation has {sigmoid_fit.MIN_POINTS} points below "
                       f"{fraction} * {target}"}

  def best(pairs):  # the highest value; ties to the smallest (B_p, n)
    return max(pairs, key=lambda x: (x[0], [-k for k in x[1]]))

  (pred, pred_key), (obs, obs_key) = best(predicted), best(observed)
  return {"fit_max_rollouts": fraction * target, "target_rollouts": target,
          "predicted": pred, "predicted_problems_per_batch": pred_key[0],
          "predicted_rollouts_per_problem": pred_key[1],
          "observed": obs, "observed_problems_per_batch": obs_key[0],
          "observed_rollouts_per_problem": obs_key[1], "error": pred - obs}


# --- Directories and files -----------------------------------------------------


def load_sweep(root: str) -> tuple[list[run_dir.Run], list[dict[str, str]]]:
  """Every run under `root`, and {'path', 'reason'} for each one that is broken."""
  if not storage.path(root).is_dir():
    raise AnalysisError(f"runs directory {root!r} does not exist")
  paths = run_dir.find_runs(root)
  if not paths:
    raise AnalysisError(f"no run directories (with {run_dir.CONFIG_FILE} and "
                        f"{run_dir.METRICS_FILE}) under {root!r}")
  runs, skipped = [], []
  for path, loaded in run_dir.iter_loaded_runs(paths):
    if isinstance(loaded, run_dir.RunFormatError):
      logging.warning("skipping run %s: %s", path, loaded)
      skipped.append({"path": path, "reason": str(loaded)})
    else:
      runs.append(loaded)
  return runs, skipped


def run_curves(runs: Sequence[run_dir.Run], metric: str, skipped: list[dict[str, str]]):
  """Per-run curves of `metric`; runs that cannot provide one are added to `skipped`."""
  curves = []
  for run in runs:
    try:
      rc = records.run_curve(run, metric)
    except run_dir.RunFormatError as e:
      logging.warning("skipping run %s: %s", run.path, e)
      skipped.append({"path": run.path, "reason": str(e)})
      continue
    if rc.rollouts_E.size == 0:
      reason = f"{run_dir.metrics_path(run.path)}: never logged {metric}"
      logging.warning("skipping run %s: %s", run.path, reason)
      skipped.append({"path": run.path, "reason": reason})
      continue
    curves.append(rc)
  return curves


@dataclasses.dataclass
class SweepAnalysis:
  runs_dir: str
  options: Options
  primary: MetricAnalysis
  views: dict[str, MetricAnalysis]
  skipped: list[dict[str, str]]
  run_records: list[records.RunCurve]
  extrapolation: dict[str, Any]
  num_runs: int

  def to_dict(self) -> dict[str, Any]:
    out = {"schema_version": SCHEMA_VERSION, "runs_dir": self.runs_dir,
           "compute_unit": "rollouts", "options": dataclasses.asdict(self.options),
           "num_runs": self.num_runs, "skipped": self.skipped}
    out.update(self.primary.to_dict())
    out["extrapolation"] = self.extrapolation
    out["records"] = [{"path": rc.path, "problems_per_batch": rc.problems_per_batch,
                       "rollouts_per_problem": rc.rollouts_per_problem,
                       "rollouts": rc.rollouts_E.tolist(), "values": rc.values_E.tolist()}
                      for rc in self.run_records]
    out["views"] = {name: {k: v for k, v in view.to_dict().items()
                           if k in ("metric", "r0", "frontier", "n_star_fit", "fits")}
                    for name, view in self.views.items()}
    return out


def analyze_directory(root: str, options: Options = Options()) -> SweepAnalysis:
  """Loads every run under `root` and analyses `options.metric` (and companions)."""
  runs, skipped = load_sweep(root)
  num_runs = len(runs) + len(skipped)
  if not runs:
    raise AnalysisError(f"every run under {root!r} is broken: " +
                        "; ".join(f"{s['path']}: {s['reason']}" for s in skipped))
  available = records.metric_names(runs)
  if options.metric not in available:
    raise AnalysisError(f"metric {options.metric!r} was not logged by any run under "
                        f"{root!r}; metrics that exist: {', '.join(available) or 'none'}")
  curves = run_curves(runs, options.metric, skipped)
  primary = analyze_metric(curves, options.metric, options)
  if not primary.curve_fits:
    raise AnalysisError(f"no allocation under {root!r} has {sigmoid_fit.MIN_POINTS} "
                        f"evaluations of {options.metric} to fit")
  views = {}
  if options.companions:
    for name in companion_metrics(options.metric):
      if name != options.metric and name in available:
        views[name] = analyze_metric(run_curves(runs, name, []), name, options, groups=False)
  return SweepAnalysis(
      runs_dir=storage.absolute(root), options=options, primary=primary, views=views,
      skipped=skipped, run_records=[rc.records(options.bin_width) for rc in curves],
      extrapolation=extrapolation(primary, options.extrapolation_fraction),
      num_runs=num_runs)


def json_safe(x):
  """Non-finite floats become null (strict JSON); NumPy scalars become Python."""
  if isinstance(x, dict):
    return {str(k): json_safe(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [json_safe(v) for v in x]
  if isinstance(x, np.generic):
    x = x.item()
  if isinstance(x, float) and not math.isfinite(x):
    return None
  return x


def write_analysis(analysis: SweepAnalysis, path: storage.PathLike) -> dict[str, Any]:
  """Writes analysis.json (atomically, local or gs://) and returns the dict written."""
  out = json_safe(analysis.to_dict())
  storage.write_json(path, out, indent=1, sort_keys=True, allow_nan=False)
  return out
