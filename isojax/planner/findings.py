"""The findings table: each claim of the papers, the measured effect and a verdict.

Input: the experiments of a study, {sweep name: experiment dict} as
`experiments.analyze_experiment` returns them, each with `difficulty` ("easy",
"hard" or "") added. Output: rows {finding, claim, effect, verdict, sweep, note} and
their markdown. A verdict is decided by the effect's bootstrap interval, never by
its point value (`bootstrap.sign_verdict`, `bootstrap.margin_verdict`); a claim with
no experiment in the study is left out.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

import numpy as np

from isojax import storage
from isojax.planner import bootstrap

FINDINGS_FILE = "findings.md"
EXPERIMENT_FILE = "experiment.json"   # = experiments.EXPERIMENT_FILE (no JAX import here)

# Finding 4's practical-equivalence margin: B_p "barely matters" when the spread of
# final avg@k across B_p stays below this (accuracy units).
BP_MARGIN = 0.05
# ScaleRL: the end of a run is predicted within about +-0.02.
EXTRAPOLATION_TOLERANCE = 0.02

CLAIMS = {
    "1": "n*(C) grows with C (then saturates)",
    "2a": "hard set: larger n raises best@k (coverage)",
    "2b": "easy set: larger n raises worst@k (sharpening)",
    "2c": "hard sets saturate at a smaller n than easy sets",
    "3": "at fixed batch B, n*(M) grows with the number of updates M",
    "4": "B_p barely matters (moderate range, fixed n and C)",
    "5": "larger n mitigates interference (fewer problems pushed to pass@1 = 0 or 1)",
    "6": "small problem sets overfit: validation falls late in the run",
    "7a": "decoupled baseline (estimate from n_est, train on n_train) beats plain n_train",
    "7b": "plain n_est beats the decoupled baseline",
    "8": "the n*(C) trend holds with other RL algorithms",
    "9": "a run's end is predicted from its first half (within +-0.02)",
}

# What the verdicts rest on, measured beside them (not claims of the paper): whether
# training on some problems raises others, whether the runs had reached their ceilings
# at the budget, and whether every n heads for the same ceiling.
MECHANISMS = {
    "T": "training on a few problems raises held-out ones (transfer across problems)",
    "S": "the runs were still rising when the budget ran out (not saturated)",
    "K": "every n heads for the same ceiling (the model's capacity caps the gain)",
}
# Mechanism K's margin: the ceilings of the values of n agree within this (accuracy).
CEILING_MARGIN = 0.02


@dataclasses.dataclass(frozen=True)
class Row:
  finding: str
  sweep: str
  measured: str       # what the effect is, in words
  effect: dict[str, Any]
  verdict: str
  note: str = ""

  @property
  def claim(self) -> str:
    return CLAIMS.get(self.finding) or MECHANISMS[self.finding]

  def to_dict(self) -> dict[str, Any]:
    e = {k: v for k, v in self.effect.items() if k != "samples"}
    return dict(finding=self.finding, claim=self.claim, sweep=self.sweep,
                measured=self.measured, effect=e, verdict=self.verdict, note=self.note)


def _difference(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
  """The effect a - b from two independent sets of replicates (different problems)."""
  sa, sb = np.asarray(a["samples"], float), np.asarray(b["samples"], float)
  size = min(sa.size, sb.size)
  return bootstrap.effect(a["value"] - b["value"], sa[:size] - sb[:size],
                          level=a.get("level", bootstrap.DEFAULT_LEVEL))


def _rows_iso(name: str, exp: Mapping[str, Any], *, prefix: str = "",
              finding: str = "1") -> list[Row]:
  effects = exp["effects"]
  rows = []
  rise = effects.get(f"n_star_rise{prefix}")
  if rise is not None:
    sat = effects.get(f"log2_n_saturation{prefix}")
    note = ""
    if sat is not None and math.isfinite(sat["value"]):
      note = (f"fitted saturation n = {2 ** sat['value']:.3g} "
              f"[{2 ** sat['lo']:.3g}, {2 ** sat['hi']:.3g}]")
    rows.append(Row(finding, name, "doublings of n* from the frontier's start to its end",
                    rise, bootstrap.sign_verdict(rise), note))
  return rows


def _rows_extrapolation(experiments: Mapping[str, Mapping[str, Any]], *,
                        num_resamples: int, seed: int) -> list[Row]:
  errors = np.array([e["error"] for exp in experiments.values()
                     for e in exp.get("extrapolation", []) if "error" in e], float)
  if errors.size < 2:
    return []
  rng = np.random.default_rng(seed)
  abs_errors = np.abs(errors)
  samples = [float(np.median(rng.choice(abs_errors, abs_errors.size)))
             for _ in range(num_resamples)]
  e = bootstrap.effect(float(np.median(abs_errors)), samples)
  lo, hi = e["lo"], e["hi"]
  if hi <= EXTRAPOLATION_TOLERANCE:
    verdict = bootstrap.YES
  elif lo > EXTRAPOLATION_TOLERANCE:
    verdict = bootstrap.NO
  else:
    verdict = bootstrap.INCONCLUSIVE
  within = float(np.mean(abs_errors <= EXTRAPOLATION_TOLERANCE))
  frontier = [f"{name}{'/' + v if v else ''} {x['error']:+.3f}"
              for name, exp in experiments.items()
              for v, x in (exp.get("frontier_extrapolation") or {}).items()
              if x and x.get("error") is not None]
  note = f"{errors.size} runs; {within:.0%} within +-0.02; interval: bootstrap over runs"
  if frontier:
    note += "; frontier's best value at C_max, predicted - observed: " + ", ".join(frontier)
  return [Row("9", "all", "median abs(predicted - observed) of the final avg@k over runs",
              e, verdict, note)]


def _finite(x) -> float:
  return float("nan") if x is None else float(x)


def from_json(experiment: Mapping[str, Any]) -> dict[str, Any]:
  """An experiment as read from experiment.json: JSON's nulls back to NaN."""
  effects = {name: dict(e, value=_finite(e["value"]), lo=_finite(e["lo"]),
                        hi=_finite(e["hi"]), samples=[_finite(x) for x in e["samples"]])
             for name, e in experiment["effects"].items()}
  return dict(experiment, effects=effects)


def table(experiments: Mapping[str, Mapping[str, Any]], *,
          num_resamples: int = bootstrap.DEFAULT_RESAMPLES, seed: int = 0) -> list[Row]:
  """Rows in the order of the paper's findings."""
  experiments = {name: from_json(e) for name, e in experiments.items()}
  rows: list[Row] = []
  iso = {name: e for name, e in experiments.items() if e["kind"] == "iso_compute"}
  by_difficulty = {d: [(name, e) for name, e in iso.items() if e.get("difficulty") == d]
                   for d in ("hard", "easy")}
  for name, exp in iso.items():
    rows += _rows_iso(name, exp)
  # Finding 2: coverage (best@k) on each hard set, sharpening (worst@k) on each easy set
  # (a testbed may sweep one at several budgets).
  for finding, difficulty, which in (("2a", "hard", "best"), ("2b", "easy", "worst")):
    for name, exp in by_difficulty[difficulty]:
      e = exp["effects"].get(f"{which}_slope_log2_n")
      if e:
        rows.append(Row(finding, name, f"change of final {which}@k per doubling of n (at "
                        "fixed C)", e, bootstrap.sign_verdict(e)))
  for hard_name, hard in by_difficulty["hard"]:
    for easy_name, easy in by_difficulty["easy"]:
      e = _difference(hard["effects"]["log2_n_star_end"], easy["effects"]["log2_n_star_end"])
      rows.append(Row("2c", f"{hard_name} - {easy_name}",
                      "log2 n* at the largest C, hard minus easy", e,
                      bootstrap.sign_verdict(e, expected=-1)))
  for name, exp in experiments.items():
    if exp["kind"] == "fixed_batch":
      rows += _rows_iso(name, exp, finding="3")
  for name, exp in experiments.items():
    if exp["kind"] == "problems_per_batch":
      e = exp["effects"]["spread"]
      v = exp["effects"]
      rows.append(Row("4", name, "spread (max - min) of final avg@k across B_p", e,
                      bootstrap.margin_verdict(e, BP_MARGIN),
                      f"margin {BP_MARGIN}; late-run volatility smallest B_p "
                      f"{v['volatility_smallest_bp']['value']:.3f}, largest "
                      f"{v['volatility_largest_bp']['value']:.3f}"))
  for name, exp in iso.items():
    e = exp["effects"].get("extreme_change_slope_log2_n")
    if e:
      rows.append(Row("5", name, "change in the fraction of training problems at pass@1 = 0 "
                      "or 1, per doubling of n", e, bootstrap.sign_verdict(e, expected=-1)))
  for name, exp in experiments.items():
    if exp["kind"] == "problem_set_size":
      e = exp["effects"]["overfit_gap"]
      change = exp["details"].get("train_reward_change", {})
      rows.append(Row("6", name, "late validation drop, smallest set minus full set", e,
                      bootstrap.sign_verdict(e), "train reward change (last - first "
                      "quarter): " + ", ".join(f"{k} {v:+.3f}" for k, v in change.items())))
  for name, exp in experiments.items():
    if exp["kind"] == "decoupled_baseline":
      for finding, key in (("7a", "decoupled_minus_plain_train"),
                           ("7b", "plain_estimate_minus_decoupled")):
        e = exp["effects"][key]
        rows.append(Row(finding, name, f"final avg@k, {key.replace('_', ' ')}", e,
                        bootstrap.sign_verdict(e)))
  for name, exp in experiments.items():
    if exp["kind"] == "algorithms":
      for variant in exp["variants"]:
        for row in _rows_iso(name, exp, prefix=f"_{variant}", finding="8"):
          rows.append(dataclasses.replace(row, sweep=f"{name}/{variant}"))
  rows += _rows_extrapolation(experiments, num_resamples=num_resamples, seed=seed)
  order = list(CLAIMS)
  return sorted(rows, key=lambda r: order.index(r.finding))


def mechanism_table(experiments: Mapping[str, Mapping[str, Any]]) -> list[Row]:
  """Rows of `MECHANISMS` for the experiments that measure them: transfer from the
  problem-set-size sweep; saturation and a shared ceiling from each sweep whose n*
  trend is a claim (iso-compute, fixed-batch, and each algorithm's runs)."""
  experiments = {name: from_json(e) for name, e in experiments.items()}
  rows: list[Row] = []
  for name, exp in experiments.items():
    effects = exp["effects"]
    if exp["kind"] == "problem_set_size" and "transfer_gain" in effects:
      sizes = exp["details"].get("sizes", {})
      smallest = min((s for s in sizes.values() if s), default=None)
      f = effects["transfer_fraction"]
      rows.append(Row("T", name, f"held-out validation gain (final - first) of the runs "
                      f"trained on {smallest or 'the fewest'} problems", effects["transfer_gain"],
                      bootstrap.sign_verdict(effects["transfer_gain"]),
                      f"fraction of the full set's gain {_number(f['value'])} "
                      f"[{_number(f['lo'])}, {_number(f['hi'])}]"))
  for name, exp in experiments.items():
    if exp["kind"] in ("iso_compute", "fixed_batch"):
      rows += _rows_saturation(name, exp["effects"])
    elif exp["kind"] == "algorithms":
      for variant in exp["variants"]:
        rows += _rows_saturation(f"{name}/{variant}", exp["effects"], f"_{variant}")
  return sorted(rows, key=lambda r: list(MECHANISMS).index(r.finding))


def _rows_saturation(sweep: str, effects: Mapping[str, Any], suffix: str = "") -> list[Row]:
  """S and K of one sweep (or one variant's runs): beside claims 1, 3 and 8."""
  headroom, spread = effects.get(f"headroom{suffix}"), effects.get(f"asymptote_spread{suffix}")
  if headroom is None or spread is None:
    return []
  return [Row("S", sweep, "fitted asymptote minus final value, mean over runs", headroom,
              bootstrap.sign_verdict(headroom)),
          Row("K", sweep, "largest minus smallest fitted asymptote across n", spread,
              bootstrap.margin_verdict(spread, CEILING_MARGIN), f"margin {CEILING_MARGIN}")]


def _number(x: float) -> str:
  return "nan" if not math.isfinite(x) else f"{x:+.3f}"


def to_markdown(rows: list[Row], claim: str = "the paper's claim") -> str:
  """The table: finding, the claim, what was measured, effect [interval], verdict."""
  lines = [f"| # | {claim} | sweep | measured | effect [90% CI] | verdict | note |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    e = r.effect
    lines.append(f"| {r.finding} | {r.claim} | {r.sweep} | {r.measured} | "
                 f"{_number(e['value'])} [{_number(e['lo'])}, {_number(e['hi'])}] | "
                 f"**{r.verdict}** | {r.note} |")
  return "\n".join(lines) + "\n"


def read_experiments(study_dir: str) -> dict[str, dict[str, Any]]:
  """{sweep name: experiment} for every DIR/<sweep>/experiment.json of a study."""
  root = storage.path(study_dir)
  if not root.is_dir():
    raise FileNotFoundError(f"study directory {study_dir!r} does not exist")
  found = {}
  for sub in sorted(p for p in root.iterdir() if p.is_dir()):
    path = sub / EXPERIMENT_FILE
    if path.is_file():
      found[sub.name] = storage.read_json(path)
  return found


def write_study_findings(study_dir: str, *, seed: int = 0) -> tuple[list[Row], str]:
  """The findings table of a study directory, written to DIR/findings.md."""
  experiments = read_experiments(study_dir)
  if not experiments:
    raise FileNotFoundError(f"no <sweep>/{EXPERIMENT_FILE} under {study_dir!r}: run the "
                            "study (python -m launch.study) first")
  rows = table(experiments, seed=seed)
  text = (f"# Findings of {os.path.basename(os.path.normpath(study_dir))}\n\n"
          "Each effect: the estimate on the runs as measured and its 90% bootstrap "
          "interval (validation problems resampled, and seeds where an allocation has "
          "several). Verdicts follow the interval: yes when it lies on the paper's side, "
          "no when it lies on the other side (or at zero), inconclusive when it straddles "
          "it.\n\n" + to_markdown(rows))
  mechanisms = mechanism_table(experiments)
  if mechanisms:
    text += ("\n## What the verdicts rest on\n\nMeasured the same way, beside the claims: "
             "whether training transfers across problems (then covering each problem "
             "matters less than the paper's setting assumes), whether the runs had "
             "saturated when the budget ran out, and whether every n heads for one "
             "ceiling.\n\n" + to_markdown(mechanisms, "what is tested"))
  storage.write_text(os.path.join(study_dir, FINDINGS_FILE), text)
  return rows, text
