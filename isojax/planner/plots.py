"""PNG figures of a sweep analysis (matplotlib without pyplot: no display needed).

  metric_vs_compute.png   every allocation's evaluations and fitted sigmoid, the
                          frontier drawn over them and coloured by n*
  n_star.png              n*(C) on the frontier and its fitted sigmoid law, with
                          the saturation n and compute marked
  views.png               the frontier and n*(C) for avg@k, best@k and worst@k
                          (sharpening vs coverage)
  experiment.png          an experiment's final values per run against what it
                          varies, and its effects with their bootstrap intervals

Colour always encodes n (log scale), so figures read together. Figures are built
on `matplotlib.figure.Figure` directly, not pyplot, so importing this module never
switches the backend of a notebook that uses it.
"""

from __future__ import annotations

import math
import os
from typing import Sequence

import matplotlib
from matplotlib import cm
from matplotlib import colors
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
import numpy as np

from isojax import storage
from isojax.planner import analysis as analysis_lib
from isojax.planner import frontier as frontier_lib

METRIC_VS_COMPUTE = "metric_vs_compute.png"
N_STAR = "n_star.png"
VIEWS = "views.png"
EXPERIMENT = "experiment.png"
# What an experiment kind varies: the x axis of its final-value panel.
_EXPERIMENT_X = {"problems_per_batch": ("problems_per_batch", "B_p (log2)")}
DPI = 110  # every figure isojax writes (the sweep analysis's, docs/results/img/)
_LINESTYLES = ("-", "--", ":", "-.")


def _n_colours(n_values: Sequence[int]):
  """A colour function over log2 n and the matching ScalarMappable for a colourbar."""
  logs = np.log2(np.asarray(sorted(set(n_values)), np.float64))
  norm = colors.Normalize(vmin=logs.min() - 0.5, vmax=max(logs.max(), logs.min()) + 0.5)
  cmap = matplotlib.colormaps["viridis"]
  mappable = cm.ScalarMappable(norm=norm, cmap=cmap)
  return (lambda n: cmap(norm(np.log2(n)))), mappable


def _colourbar(fig, ax, mappable, n_values):
  bar = fig.colorbar(mappable, ax=ax, pad=0.02)
  ticks = sorted(set(n_values))
  bar.set_ticks(np.log2(ticks))
  bar.set_ticklabels([str(t) for t in ticks])
  bar.set_label("n (rollouts per problem)")


def _frontier_segments(ax, points: Sequence[frontier_lib.FrontierPoint], colour_of,
                       width: float = 6.0, y_of=None, label="frontier (colour = n*)"):
  """Draws the frontier as a thick line whose colour is n* of each segment."""
  if len(points) < 2:
    return
  x = np.array([p.rollouts for p in points])
  y = np.array([p.value if y_of is None else y_of(p) for p in points])
  segments = np.stack([np.column_stack([x[:-1], y[:-1]]), np.column_stack([x[1:], y[1:]])],
                      axis=1)
  seg_colours = [colour_of(p.rollouts_per_problem) for p in points[:-1]]
  # Drawn over the fits: a black-edged band coloured by n*.
  ax.plot(x, y, color="k", lw=width + 2.5, zorder=4, solid_capstyle="round")
  ax.add_collection(LineCollection(segments, colors=seg_colours, linewidths=width,
                                   zorder=5, capstyle="round"))
  ax.plot([], [], color="0.5", lw=width, label=label)  # legend proxy


def save(fig: Figure, path: storage.PathLike) -> None:
  """The figure as an image at `path`, local or gs:// (format from the suffix)."""
  target = storage.path(path)
  with target.open("wb") as f:
    fig.savefig(f, format=target.suffix.lstrip(".") or "png", dpi=DPI)


def plot_metric_vs_compute(result: analysis_lib.MetricAnalysis, path: str,
                           max_points_per_curve: int = 200) -> None:
  """Evaluations (dots), fitted sigmoids (lines) and the frontier (thick, by n*)."""
  fig = Figure(figsize=(8, 5))
  ax = fig.subplots()
  n_values = [cf.curve.rollouts_per_problem for cf in result.curve_fits]
  colour_of, mappable = _n_colours(n_values)
  b_ps = sorted({cf.curve.problems_per_batch for cf in result.curve_fits})
  # Line style tells B_p apart when there are few; with many, colour (n) only.
  styled = 1 < len(b_ps) <= len(_LINESTYLES)
  style_of = {b_p: _LINESTYLES[i] if styled else "-" for i, b_p in enumerate(b_ps)}
  _frontier_segments(ax, result.frontier, colour_of)
  for cf in result.curve_fits:
    colour = colour_of(cf.curve.rollouts_per_problem)
    c_E, v_E = cf.curve.rollouts_E, cf.curve.values_E
    positive = c_E > 0
    step = max(1, int(np.count_nonzero(positive)) // max_points_per_curve)
    ax.scatter(c_E[positive][::step], v_E[positive][::step], s=6, color=colour,
               alpha=0.35 if len(result.curve_fits) <= 50 else 0.12, linewidths=0, zorder=2)
    grid = np.geomspace(cf.fit.compute_range[0], cf.max_compute, 80)
    ax.plot(grid, cf.fit.predict(grid), color=colour, lw=1.2,
            ls=style_of[cf.curve.problems_per_batch], zorder=3)
  if styled:
    for b_p in b_ps:
      ax.plot([], [], color="0.3", ls=style_of[b_p], label=f"B_p = {b_p}")
  ax.plot([], [], color="0.3", lw=1.2, label="fitted sigmoid")
  ax.set_xscale("log")
  ax.set_xlabel("compute C (rollouts)")
  ax.set_ylabel(result.metric)
  ax.set_title(f"{result.metric} vs compute: {len(result.curve_fits)} allocations (B_p, n), "
               "fits and frontier")
  ax.grid(True, which="major", alpha=0.3)
  ax.legend(loc="upper left", fontsize=8, framealpha=0.8)
  _colourbar(fig, ax, mappable, n_values)
  fig.tight_layout()
  save(fig, path)


def _draw_n_star(ax, result: analysis_lib.MetricAnalysis, colour="k", label_prefix=""):
  pts = result.frontier
  if not pts:
    return
  c = np.array([p.rollouts for p in pts])
  log_n = np.log2([p.rollouts_per_problem for p in pts])
  ax.step(c, log_n, where="post", color=colour, alpha=0.5, lw=1.5,
          label=f"{label_prefix}n* on the frontier")
  law = result.law
  if law is not None:
    grid = np.geomspace(*law.compute_range, 200)
    ax.plot(grid, law.log2_n_star(grid), color=colour, lw=2.2, ls="--",
            label=f"{label_prefix}sigmoid fit, n_sat = {2 ** law.log2_n_high:.0f}")


def plot_n_star(result: analysis_lib.MetricAnalysis, path: str) -> None:
  """n*(C) of the frontier, its fitted law and where n saturates."""
  fig = Figure(figsize=(7, 4.5))
  ax = fig.subplots()
  _draw_n_star(ax, result)
  law = result.law
  if law is not None:
    ax.axhline(law.log2_n_high, color="tab:red", lw=1, ls=":",
               label=f"saturation n = {2 ** law.log2_n_high:.0f}")
    saturation = law.saturation_compute()
    if law.compute_range[0] <= saturation <= law.compute_range[1]:
      ax.axvline(saturation, color="tab:red", lw=1, ls="-.",
                 label=f"90% of the rise at C = {saturation:.3g}")
  n_values = sorted({cf.curve.rollouts_per_problem for cf in result.curve_fits})
  ax.set_yticks(np.log2(n_values))
  ax.set_yticklabels([str(n) for n in n_values])
  ax.set_xscale("log")
  ax.set_xlabel("compute C (rollouts)")
  ax.set_ylabel("n* (rollouts per problem)")
  ax.set_title(f"compute-optimal n*(C) for {result.metric}")
  ax.grid(True, alpha=0.3)
  ax.legend(loc="upper left", fontsize=8)
  fig.tight_layout()
  save(fig, path)


def plot_views(sweep: analysis_lib.SweepAnalysis, path: str) -> None:
  """Frontier value and n*(C) per metric: avg@k vs best@k (coverage) vs worst@k."""
  results = {sweep.primary.metric: sweep.primary, **sweep.views}
  fig = Figure(figsize=(11, 4.5))
  ax_value, ax_n = fig.subplots(1, 2)
  palette = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
  n_values = set()
  for i, (name, result) in enumerate(sorted(results.items())):
    colour = palette[i % len(palette)]
    if result.frontier:
      ax_value.plot([p.rollouts for p in result.frontier], [p.value for p in result.frontier],
                    color=colour, lw=2, label=name)
    _draw_n_star(ax_n, result, colour=colour, label_prefix=f"{name}: ")
    n_values |= {p.rollouts_per_problem for p in result.frontier}
  for ax in (ax_value, ax_n):
    ax.set_xscale("log")
    ax.set_xlabel("compute C (rollouts)")
    ax.grid(True, alpha=0.3)
  ax_value.set_ylabel("frontier value")
  ax_value.set_title("best value reachable at each compute")
  ax_value.legend(fontsize=8)
  if n_values:
    ax_n.set_yticks(np.log2(sorted(n_values)))
    ax_n.set_yticklabels([str(n) for n in sorted(n_values)])
  ax_n.set_ylabel("n*")
  ax_n.set_title("n*(C) per metric")
  ax_n.legend(fontsize=7)
  fig.tight_layout()
  save(fig, path)


def write_plots(sweep: analysis_lib.SweepAnalysis, out_dir: str) -> list[str]:
  """Writes every figure into out_dir; returns their paths."""
  paths = [os.path.join(out_dir, name) for name in (METRIC_VS_COMPUTE, N_STAR, VIEWS)]
  plot_metric_vs_compute(sweep.primary, paths[0])
  plot_n_star(sweep.primary, paths[1])
  plot_views(sweep, paths[2])
  return paths


def plot_experiment(experiment: dict, path: str) -> None:
  """Final primary metric per run against log2 n (log2 B_p for the B_p experiment),
  one colour per variant; and each effect with its bootstrap interval."""
  metric = experiment["metric"]
  finals = [f for f in experiment["details"]["finals"] if f["metric"] == metric]
  field, xlabel = _EXPERIMENT_X.get(experiment["kind"], ("rollouts_per_problem",
                                                        "n (log2)"))
  fig = Figure(figsize=(11, 4.5))
  ax_final, ax_effects = fig.subplots(1, 2)
  palette = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]
  for i, variant in enumerate(sorted({f["variant"] for f in finals})):
    mine = [f for f in finals if f["variant"] == variant]
    ax_final.scatter([math.log2(f[field]) for f in mine], [f["final"] for f in mine],
                     color=palette[i % len(palette)], label=variant or "runs", s=18)
  ax_final.set_xlabel(xlabel)
  ax_final.set_ylabel(f"final {metric}")
  ax_final.set_title(f"{experiment['kind']}: final value per run")
  ax_final.grid(True, alpha=0.3)
  ax_final.legend(fontsize=8)
  names = [k for k, e in experiment["effects"].items()
           if all(isinstance(e.get(f), float) and math.isfinite(e[f])
                  for f in ("value", "lo", "hi"))]
  for y, name in enumerate(names):
    e = experiment["effects"][name]
    ax_effects.errorbar([e["value"]], [y], xerr=[[e["value"] - e["lo"]], [e["hi"] - e["value"]]],
                        fmt="o", color="k", capsize=3)
  ax_effects.axvline(0.0, color="grey", lw=0.8)
  ax_effects.set_yticks(range(len(names)))
  ax_effects.set_yticklabels(names, fontsize=7)
  ax_effects.set_title("effects, 90% bootstrap intervals")
  ax_effects.grid(True, axis="x", alpha=0.3)
  fig.tight_layout()
  save(fig, path)
