"""The paper's findings as statistics of a sweep, each with a bootstrap interval.

A sweep has a `kind` (the experiment it is) and optionally named variants (sets of
runs under DIR/runs/<variant>/). `analyze_experiment` loads the runs with their
per-problem evaluation counts, computes the kind's statistics on the runs as
measured and on bootstrap replicates (`isojax.planner.bootstrap`: problems, and
seeds where an allocation has several), and returns them as effects
{value, lo, hi, samples}. `isojax.planner.findings` turns effects into verdicts.

  iso_compute         (B_p, n) at fixed C: how far n* rises over the frontier
                      (doublings), n* at the end, and how the final avg/best/worst@k
                      change with log2 n (sharpening vs coverage); interference
  fixed_batch         B = B_p * n fixed, M varied: the rise of n*(M)
  problems_per_batch  n fixed, B_p varied at fixed C: the spread of final metrics
                      across B_p and their late-run volatility
  problem_set_size    the same allocations on training sets of several sizes: the
                      late-run fall of validation (overfitting) and n* per size
  decoupled_baseline  plain n_train, plain n_estimate, and the decoupled baseline
                      (estimate from n_estimate rollouts, train on n_train)
  algorithms          the iso-compute statistics per variant (CISPO, PODS, ...)
  per_problem         the compute per-problem allocation needs to reach the uniform
                      frontier's best value, over the uniform's (`time_to_value`)

A run's "final" value is its last evaluation, at its full compute (`final_value`). Not
an average of its last few: a schedule with a fixed number of evaluations puts a short
run's second-to-last one at a larger fraction of its compute (8 log-spaced evaluations:
75% at M = 8, 50% at M = 128), so on rising curves such an average would compare the
allocations at different compute and tilt every slope in n. The noise of one evaluation
is what the bootstrap's resampled problems carry into each interval.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np

from isojax import metrics
from isojax import run_dir
from isojax.planner import analysis
from isojax.planner import bootstrap
from isojax.planner import findings
from isojax.planner import n_star
from isojax.planner import records
from isojax.planner import sigmoid_fit
from isojax.planner import time_to_value

KINDS = ("iso_compute", "fixed_batch", "problems_per_batch", "problem_set_size",
         "decoupled_baseline", "algorithms", "per_problem")
DECOUPLED_VARIANTS = ("plain_train", "plain_estimate", "decoupled")
EXPERIMENT_FILE = findings.EXPERIMENT_FILE
TAIL = 1                # evaluations a final value averages: the last (module docstring)
EXTRAPOLATION_TAIL = 2  # claim 9's late evaluations, fit against persistence on one run
LOST = bootstrap.LOST   # per problem: solved at step 0, at pass@1 = 0 now
_SEP = "|"


def _key(variant: str, metric: str) -> str:
  return f"{variant}{_SEP}{metric}"


def final_value(curve: records.RunCurve) -> float:
  """The run's value at its budget: the mean of its last `TAIL` evaluations."""
  return float(curve.values_E[-TAIL:].mean())


def slope(x, y) -> float:
  """Least-squares slope of y on x; NaN with fewer than two distinct x."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  if np.unique(x).size < 2:
    return float("nan")
  dx = x - x.mean()
  return float(dx @ (y - y.mean()) / (dx @ dx))


def _finals_vs(curves: Sequence[records.RunCurve], x_of) -> tuple[np.ndarray, np.ndarray]:
  return (np.array([x_of(c) for c in curves], np.float64),
          np.array([final_value(c) for c in curves]))


def _log2_n(c: records.RunCurve) -> float:
  return math.log2(c.rollouts_per_problem)


def final_slope_log2_n(curves: Sequence[records.RunCurve]) -> float:
  """Least-squares slope of the runs' final values on log2 n (claims 2a, 2b and 5)."""
  return slope(*_finals_vs(curves, _log2_n))


def _change(c: records.RunCurve) -> float:
  """Final minus first value (the first evaluation is the base model's)."""
  return final_value(c) - float(c.values_E[0])


# --- Statistics per kind: {group: [RunCurve]} -> named floats ---------------------


def _asymptote(c: records.RunCurve, metric: str) -> float:
  """A of the run's own fitted sigmoid (R0 its first evaluation); NaN when it cannot be
  fitted."""
  lower, upper = analysis.value_bounds(metric)
  try:
    return sigmoid_fit.fit_sigmoid(c.rollouts_E, c.values_E, r0=float(c.values_E[0]),
                                   lower=lower, upper=upper).a
  except ValueError:
    return float("nan")


def saturation_stats(curves: Sequence[records.RunCurve], metric: str) -> dict[str, float]:
  """Whether the runs reached their ceilings, and whether every n has the same one.

  headroom: each run's fitted asymptote minus its final value, averaged over the runs
    (> 0: the budget stops before the runs saturate, so the frontier's end is not the
    regime where the paper finds larger n winning);
  asymptote_spread: the largest minus the smallest asymptote of the values of n (each
    the mean over its runs): near 0 when every allocation heads for one ceiling (a
    model limited by its capacity, where the allocation only sets the speed).
  """
  a = np.array([_asymptote(c, metric) for c in curves])
  finals = np.array([final_value(c) for c in curves])
  by_n: dict[int, list[float]] = {}
  for c, a_c in zip(curves, a):
    if np.isfinite(a_c):
      by_n.setdefault(c.rollouts_per_problem, []).append(a_c)
  means = [float(np.mean(v)) for v in by_n.values()]
  ok = np.isfinite(a)
  return {"headroom": float(np.mean(a[ok] - finals[ok])) if ok.any() else float("nan"),
          "asymptote_spread": max(means) - min(means) if len(means) > 1 else float("nan")}


def iso_compute_stats(groups, *, metric: str, variant: str = "") -> dict[str, float]:
  out = n_star.frontier_stats(groups[_key(variant, metric)], metric)
  out.update(saturation_stats(groups[_key(variant, metric)], metric))
  for name in analysis.companion_metrics(metric):
    curves = groups.get(_key(variant, name))
    if curves:
      label = name.split("/", 1)[1].split("@")[0]  # avg, best, worst
      out[f"{label}_slope_log2_n"] = final_slope_log2_n(curves)
  lost = groups.get(_key(variant, LOST))
  if lost:
    out["lost_slope_log2_n"] = final_slope_log2_n(lost)
  return out


def problems_per_batch_stats(groups, *, metric: str) -> dict[str, float]:
  curves = groups[_key("", metric)]
  by_b_p: dict[int, list[float]] = {}
  volatility: dict[int, list[float]] = {}
  for c in curves:
    by_b_p.setdefault(c.problems_per_batch, []).append(final_value(c))
    late = c.values_E[c.values_E.size // 2:]
    volatility.setdefault(c.problems_per_batch, []).append(
        float(np.abs(np.diff(late)).mean()) if late.size > 1 else float("nan"))
  finals = {b: float(np.mean(v)) for b, v in by_b_p.items()}
  smallest, largest = min(finals), max(finals)
  return {"spread": max(finals.values()) - min(finals.values()),
          "slope_log2_bp": slope(np.log2(list(finals)), list(finals.values())),
          "volatility_smallest_bp": float(np.mean(volatility[smallest])),
          "volatility_largest_bp": float(np.mean(volatility[largest]))}


def late_fall(c: records.RunCurve) -> float:
  """How far the run's value falls over the second half of its compute: minus the
  least-squares slope of value on compute there, times that half's span (> 0: falling).
  A trend, not max - final, which is positive for any flat noisy curve. NaN with fewer
  than two evaluations in the half."""
  c_end = float(c.rollouts_E.max())
  late = c.rollouts_E >= c_end / 2
  if np.count_nonzero(late) < 2:
    return float("nan")
  return -slope(c.rollouts_E[late], c.values_E[late]) * (c_end / 2)


def problem_set_size_stats(groups, *, metric: str, sizes: Mapping[str, float]
                           ) -> dict[str, float]:
  """Per size: the mean late fall (overfitting: `late_fall`), the mean held-out gain
  (final minus first validation value: the validation problems are never trained on)
  and log2 n* at the end; the smallest set's late fall minus the largest set's; and
  transfer: the smallest set's held-out gain, and as a fraction of the largest set's
  (near 1: training on a few problems raises unseen ones as much as training on all of
  them)."""
  out = {}
  for variant in sizes:
    curves = groups[_key(variant, metric)]
    out[f"late_fall_{variant}"] = float(np.nanmean([late_fall(c) for c in curves]))
    out[f"gain_{variant}"] = float(np.mean([_change(c) for c in curves]))
    out[f"log2_n_star_end_{variant}"] = n_star.frontier_stats(curves, metric)["log2_n_star_end"]
  smallest, largest = min(sizes, key=sizes.get), max(sizes, key=sizes.get)
  out["late_fall_smallest"] = out[f"late_fall_{smallest}"]
  out["overfit_gap"] = out[f"late_fall_{smallest}"] - out[f"late_fall_{largest}"]
  out["transfer_gain"] = out[f"gain_{smallest}"]
  full = out[f"gain_{largest}"]
  out["transfer_fraction"] = out[f"gain_{smallest}"] / full if full > 0 else float("nan")
  return out


def decoupled_stats(groups, *, metric: str) -> dict[str, float]:
  final = {v: float(np.mean([final_value(c) for c in groups[_key(v, metric)]]))
           for v in DECOUPLED_VARIANTS}
  return {**{f"final_{v}": x for v, x in final.items()},
          "decoupled_minus_plain_train": final["decoupled"] - final["plain_train"],
          "plain_estimate_minus_decoupled": final["plain_estimate"] - final["decoupled"]}


def algorithms_stats(groups, *, metric: str, variants: Sequence[str]) -> dict[str, float]:
  out = {}
  for v in variants:
    for name, x in iso_compute_stats(groups, metric=metric, variant=v).items():
      out[f"{name}_{v}"] = x
  return out


def seed_spread(groups, metric: str) -> list[dict[str, Any]]:
  """Per variant and allocation with several seeds: the final values of `metric` and its
  companions, their mean and standard deviation over seeds (the run-to-run variance a
  claim about allocations has to beat)."""
  out = []
  for key, curves in groups.items():
    variant, name = key.split(_SEP)
    if name not in analysis.companion_metrics(metric):
      continue
    for (b_p, n), members in bootstrap.by_allocation(curves).items():
      if len(members) < 2:
        continue
      finals = [final_value(c.curve()) for c in members]
      out.append({"variant": variant, "metric": name, "problems_per_batch": b_p,
                  "rollouts_per_problem": n, "seeds": [c.seed for c in members],
                  "finals": finals, "mean": float(np.mean(finals)),
                  "sd": float(np.std(finals, ddof=1))})
  return out


# --- Loading and the experiment of a sweep directory ----------------------------


def variant_dirs(runs_dir: str, variants: Sequence[str]) -> dict[str, str]:
  return ({v: os.path.join(runs_dir, v) for v in variants} if variants else {"": runs_dir})


def _load_groups(runs_dirs: Mapping[str, str], metric: str, *, interference: bool):
  """{variant|metric: [ProblemCurve]}, and {variant: [Run]}."""
  groups, loaded = {}, {}
  for variant, path in runs_dirs.items():
    runs, skipped = analysis.load_sweep(path)
    if skipped:
      raise analysis.AnalysisError(
          f"{path}: broken runs: " + "; ".join(f"{s['path']}: {s['reason']}" for s in skipped))
    loaded[variant] = runs
    for name in analysis.companion_metrics(metric):
      groups[_key(variant, name)] = [bootstrap.problem_curve(r, name) for r in runs]
    # Runs that logged no histogram (eval.train_problems = 0): no interference statistic.
    if interference and any(metrics.TRAIN_PASS1_COUNTS in line
                            for r in runs for line in r.metrics):
      groups[_key(variant, LOST)] = [
          bootstrap.problem_curve(r, LOST, counts_key=metrics.TRAIN_PASS1_COUNTS)
          for r in runs]
  return groups, loaded


def _extrapolation(runs_by_variant: Mapping[str, Sequence[run_dir.Run]], metric: str,
                   fraction: float = 0.5) -> list[dict[str, Any]]:
  """Per run: fit a sigmoid on compute <= fraction * C_end, predict the end."""
  lower, upper = analysis.value_bounds(metric)
  out = []
  for variant, runs in runs_by_variant.items():
    for run in runs:
      c = records.run_curve(run, metric)
      entry = {"variant": variant, "path": run.path,
               "problems_per_batch": c.problems_per_batch,
               "rollouts_per_problem": c.rollouts_per_problem}
      try:
        check = sigmoid_fit.extrapolation_check(c.rollouts_E, c.values_E, fraction=fraction,
                                                r0=float(c.values_E[0]), lower=lower,
                                                upper=upper, tail=EXTRAPOLATION_TAIL)
        entry.update({k: check[k] for k in ("predicted", "observed", "error", "persistence",
                                            "persistence_error")})
      except ValueError as e:
        entry["skipped"] = str(e)
      out.append(entry)
  return out


def _frontier_extrapolation(runs_by_variant: Mapping[str, Sequence[run_dir.Run]],
                            metric: str, fraction: float = 0.5) -> dict[str, Any]:
  """Per variant: the frontier fitted on compute <= fraction * C_max predicts the best
  value (and allocation) at C_max (`analysis.extrapolation`'s frontier part)."""
  out = {}
  for variant, runs in runs_by_variant.items():
    curves = analysis.run_curves(runs, metric, [])
    result = analysis.analyze_metric(curves, metric, analysis.Options(metric=metric),
                                     groups=False)
    out[variant] = analysis.extrapolation(result, fraction)["frontier"]
  return out


def _train_reward_change(run: run_dir.Run) -> float:
  """Mean train reward over the last quarter of steps minus the first quarter."""
  _, r = run.series(metrics.TRAIN_REWARD)
  if len(r) < 4:
    return float("nan")
  q = len(r) // 4
  return float(np.mean(r[-q:]) - np.mean(r[:q]))


def _set_size(runs: Sequence[run_dir.Run]) -> float:
  sizes = {int(r.config.get("task", {}).get("max_train_problems", 0)) for r in runs}
  if len(sizes) != 1:
    raise analysis.AnalysisError(f"runs of one variant use training-set sizes {sorted(sizes)}")
  (size,) = sizes
  return float(size) if size > 0 else math.inf  # 0: all of them


def analyze_experiment(runs_dir: str, kind: str, variants: Sequence[str] = (), *,
                       metric: str = metrics.val_avg(4),
                       num_resamples: int = bootstrap.DEFAULT_RESAMPLES,
                       seed: int = 0) -> dict[str, Any]:
  """The kind's effects (with bootstrap intervals) of the runs under `runs_dir`."""
  if kind not in KINDS:
    raise analysis.AnalysisError(f"kind={kind!r}: expected one of {', '.join(KINDS)}")
  if kind == "per_problem" and set(variants) != set(time_to_value.VARIANTS):
    raise analysis.AnalysisError(f"kind=per_problem needs the variants "
                                 f"{', '.join(time_to_value.VARIANTS)}; got {list(variants)}")
  if kind == "decoupled_baseline" and set(variants) != set(DECOUPLED_VARIANTS):
    raise analysis.AnalysisError(f"kind=decoupled_baseline needs the variants "
                                 f"{', '.join(DECOUPLED_VARIANTS)}; got {list(variants)}")
  dirs = variant_dirs(runs_dir, variants)
  groups, runs = _load_groups(dirs, metric,
                              interference=kind in ("iso_compute", "algorithms"))
  details: dict[str, Any] = {}
  if kind in ("iso_compute", "fixed_batch"):
    def statistic(g):
      return iso_compute_stats(g, metric=metric)
  elif kind == "problems_per_batch":
    def statistic(g):
      return problems_per_batch_stats(g, metric=metric)
  elif kind == "problem_set_size":
    sizes = {v: _set_size(runs[v]) for v in variants}
    details["sizes"] = {v: (None if math.isinf(s) else int(s)) for v, s in sizes.items()}
    details["train_reward_change"] = {
        v: float(np.nanmean([_train_reward_change(r) for r in runs[v]])) for v in variants}

    def statistic(g):
      return problem_set_size_stats(g, metric=metric, sizes=sizes)
  elif kind == "decoupled_baseline":
    def statistic(g):
      return decoupled_stats(g, metric=metric)
  elif kind == "per_problem":
    def statistic(g):
      return time_to_value.per_problem_stats(g[_key("uniform", metric)],
                                             g[_key("per_problem", metric)], tail=TAIL)
  else:
    def statistic(g):
      return algorithms_stats(g, metric=metric, variants=list(variants))
  point, samples = bootstrap.bootstrap(groups, statistic, num_resamples=num_resamples,
                                       seed=seed)
  details["seed_spread"] = seed_spread(groups, metric)
  details["finals"] = [
      {"variant": key.split(_SEP)[0], "metric": key.split(_SEP)[1], "path": c.path,
       "problems_per_batch": c.problems_per_batch, "rollouts_per_problem": c.rollouts_per_problem,
       "seed": c.seed, "final": final_value(c.curve()), "first": float(c.curve().values_E[0])}
      for key, curves in groups.items() for c in curves]
  return {"kind": kind, "metric": metric, "variants": list(variants),
          "num_runs": sum(len(r) for r in runs.values()),
          "fewest_seeds": bootstrap.fewest_seeds(groups),
          "uncorrected_seeds": [
              {"variant": key.split(_SEP)[0], "metric": key.split(_SEP)[1],
               "problems_per_batch": b_p, "rollouts_per_problem": n}
              for key, (b_p, n) in bootstrap.uncorrected_allocations(groups)],
          "compute_end": max(float(c.rollouts_E.max()) for cs in groups.values() for c in cs),
          "effects": {name: bootstrap.effect(point[name], samples[name]) for name in point},
          "extrapolation": _extrapolation(runs, metric),
          "frontier_extrapolation": _frontier_extrapolation(runs, metric), "details": details}
