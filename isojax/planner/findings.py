"""The findings table: each claim of the papers, the measured effect and a verdict.

Input: the experiments of a study, {sweep name: experiment dict} as
`experiments.analyze_experiment` returns them, each with `difficulty` ("easy",
"hard" or "") added, and any earlier looks at the same runs (`LOOKS_FILE`). Output:
rows (`verdicts.Row`: finding, claim, effect, p, verdict, sweep, note), decided by
`verdicts.decide`, and their markdown. A claim with no experiment in the study is left
out.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Mapping

import numpy as np

from isojax import storage
from isojax.planner import bootstrap
from isojax.planner.verdicts import (CLAIMS, EQUIVALENCE_MARGIN, MECHANISMS, Row, decide,
                                     margin_row, sign_row)

FINDINGS_FILE = "findings.md"
EXPERIMENT_FILE = "experiment.json"   # = experiments.EXPERIMENT_FILE (no JAX import here)
LOOKS_FILE = "earlier_looks.json"     # a sweep's experiments at smaller budgets, oldest first


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
    rows.append(sign_row(finding, name, "doublings of n* (the centre of the n within "
                          f"{EQUIVALENCE_MARGIN} of the best fit) from C_end / 16 (or the latest "
                          "first evaluation, if later) to C_end",
                          rise, seeds=_seeds(exp), note=_saturation_note(effects, prefix)))
  return rows


def _saturation_note(effects: Mapping[str, Any], prefix: str) -> str:
  """"Then saturates": censored when n* at the end reaches the largest n swept."""
  censored = effects.get(f"n_star_censored{prefix}")
  if censored is not None and censored["value"] == 1.0:
    return "saturation censored: n* at C_end includes the largest n swept"
  sat = effects.get(f"log2_n_saturation{prefix}")
  if sat is not None and math.isfinite(sat["value"]):
    return (f"n* below the largest n at C_end; fitted saturation n = {2 ** sat['value']:.3g} "
            f"[{2 ** sat['lo']:.3g}, {2 ** sat['hi']:.3g}]")
  return ""


def _seeds(exp: Mapping[str, Any]) -> int:
  """The fewest seeds of an allocation of the experiment (1 for experiments written
  before seeds were counted: they ran one seed per allocation)."""
  return int(exp.get("fewest_seeds") or 1)


def _rows_extrapolation(experiments: Mapping[str, Mapping[str, Any]], *,
                        num_resamples: int, seed: int) -> list[Row]:
  """Claim 9: each run's sigmoid fitted on its first half of compute predicts its values
  strictly after that half; the median absolute error over runs (interval: runs
  resampled) against the margin, beside persistence (the first half's last value)."""
  checks = [e for exp in experiments.values() for e in exp.get("extrapolation", [])
            if "error" in e]
  if len(checks) < 2:
    return []
  abs_errors = np.abs([e["error"] for e in checks])
  persistence = np.abs([e.get("persistence_error", np.nan) for e in checks])
  rng = np.random.default_rng(seed)
  picks = [rng.integers(0, abs_errors.size, abs_errors.size) for _ in range(num_resamples)]
  e = bootstrap.effect(float(np.median(abs_errors)),
                       [float(np.median(abs_errors[i])) for i in picks])
  note = (f"{abs_errors.size} runs; {np.mean(abs_errors <= EQUIVALENCE_MARGIN):.0%} within "
          f"+-{EQUIVALENCE_MARGIN}; interval: bootstrap over runs")
  if np.isfinite(persistence).all():
    gap = bootstrap.effect(float(np.median(abs_errors) - np.median(persistence)),
                           [float(np.median(abs_errors[i]) - np.median(persistence[i]))
                            for i in picks])
    note += (f"; persistence (the first half's last value) {np.median(persistence):.3f}, "
             f"fit minus persistence {_number(gap['value'])} [{_number(gap['lo'])}, "
             f"{_number(gap['hi'])}]")
  frontier = [f"{name}{'/' + v if v else ''} {x['error']:+.3f}"
              for name, exp in experiments.items()
              for v, x in (exp.get("frontier_extrapolation") or {}).items()
              if x and x.get("error") is not None]
  if frontier:
    note += "; frontier's best value at C_max, predicted - observed: " + ", ".join(frontier)
  return [margin_row("9", "all", "median abs(predicted - observed) over runs, observed "
                      "strictly after the fit's first half", e, note=note)]


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
  """The decided rows (`decide`) in the order of the paper's findings; the primary family
  also holds every earlier look of each sweep (its experiment's `earlier_looks`)."""
  rows = raw_table(experiments, num_resamples=num_resamples, seed=seed)
  earlier_p, looks = [], {}
  for name, exp in experiments.items():
    earlier = exp.get("earlier_looks") or []
    if earlier:
      looks[name] = f"{len(earlier) + 1} of {len(earlier) + 1}"
    for old in earlier:
      earlier_p += [r.p for r in raw_table({name: dict(old, difficulty=exp.get("difficulty"))},
                                           num_resamples=num_resamples, seed=seed)
                    if r.primary]
  rows = [dataclasses.replace(r, look=looks.get(r.sweep, "")) if r.primary else r
          for r in rows]
  return decide(rows, earlier_p)


def raw_table(experiments: Mapping[str, Mapping[str, Any]], *,
              num_resamples: int = bootstrap.DEFAULT_RESAMPLES, seed: int = 0) -> list[Row]:
  """Rows with the verdicts of their intervals alone, in the order of the findings."""
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
        rows.append(sign_row(finding, name, f"change of final {which}@k per doubling of n "
                              "(at fixed C)", e, seeds=_seeds(exp)))
  for hard_name, hard in by_difficulty["hard"]:
    for easy_name, easy in by_difficulty["easy"]:
      e = _difference(hard["effects"]["log2_n_star_end"], easy["effects"]["log2_n_star_end"])
      rows.append(sign_row("2c", f"{hard_name} - {easy_name}",
                            "log2 n* at the largest C, hard minus easy", e, expected=-1,
                            seeds=min(_seeds(hard), _seeds(easy))))
  for name, exp in experiments.items():
    if exp["kind"] == "fixed_batch":
      rows += _rows_iso(name, exp, finding="3")
  for name, exp in experiments.items():
    if exp["kind"] == "problems_per_batch":
      e = exp["effects"]["spread"]
      v = exp["effects"]
      rows.append(margin_row("4", name, "spread (max - min) of final avg@k across B_p", e,
                              seeds=_seeds(exp), note=(
                                  f"margin {EQUIVALENCE_MARGIN}; late-run volatility smallest "
                                  f"B_p {v['volatility_smallest_bp']['value']:.3f}, largest "
                                  f"{v['volatility_largest_bp']['value']:.3f}")))
  for name, exp in iso.items():
    e = exp["effects"].get("lost_slope_log2_n")
    if e:
      rows.append(sign_row("5", name, "change in the fraction of training problems solved "
                            "at step 0 and now at pass@1 = 0, per doubling of n", e,
                            expected=-1, seeds=_seeds(exp)))
  for name, exp in experiments.items():
    if exp["kind"] == "problem_set_size":
      e = exp["effects"]["overfit_gap"]
      own = exp["effects"].get("late_fall_smallest")
      change = exp["details"].get("train_reward_change", {})
      note = (f"smallest set's own late fall {_number(own['value'])} [{_number(own['lo'])}, "
              f"{_number(own['hi'])}]; " if own else "")
      rows.append(sign_row("6", name, "fall of validation over the runs' second half of "
                            "compute (fitted trend), smallest set minus full set", e,
                            seeds=_seeds(exp), note=note + "train reward change (last - "
                            "first quarter): " + ", ".join(f"{k} {v:+.3f}"
                                                           for k, v in change.items())))
  for name, exp in experiments.items():
    if exp["kind"] == "decoupled_baseline":
      for finding, key in (("7a", "decoupled_minus_plain_train"),
                           ("7b", "plain_estimate_minus_decoupled")):
        rows.append(sign_row(finding, name, f"final avg@k, {key.replace('_', ' ')}",
                              exp["effects"][key], seeds=_seeds(exp)))
  for name, exp in experiments.items():
    if exp["kind"] == "algorithms":
      for variant in exp["variants"]:
        for row in _rows_iso(name, exp, prefix=f"_{variant}", finding="8"):
          rows.append(dataclasses.replace(row, sweep=f"{name}/{variant}"))
  rows += _rows_extrapolation(experiments, num_resamples=num_resamples, seed=seed)
  for name, exp in experiments.items():
    if exp["kind"] == "per_problem":
      v = exp["effects"]
      rows.append(sign_row("10", name, "log2 of the rollouts per-problem allocation needs to "
                            "reach the uniform frontier's best final value, over the "
                            "uniform allocations'", v["log2_compute_ratio"], expected=-1,
                            seeds=_seeds(exp), note=(
                                f"target {_number(v['uniform_best']['value'])}; per-problem "
                                f"best {_number(v['per_problem_best']['value'])}" + (
                                    "" if v["reached"]["value"] else
                                    "; never reached: its largest compute stands in"))))
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
      rows.append(sign_row("T", name, f"held-out validation gain (final - first) of the "
                            f"runs trained on {smallest or 'the fewest'} problems",
                            effects["transfer_gain"], seeds=_seeds(exp), note=(
                                f"fraction of the full set's gain {_number(f['value'])} "
                                f"[{_number(f['lo'])}, {_number(f['hi'])}]")))
  for name, exp in experiments.items():
    if exp["kind"] in ("iso_compute", "fixed_batch"):
      rows += _rows_saturation(name, exp["effects"], seeds=_seeds(exp))
    elif exp["kind"] == "algorithms":
      for variant in exp["variants"]:
        rows += _rows_saturation(f"{name}/{variant}", exp["effects"], f"_{variant}",
                                 seeds=_seeds(exp))
  rows = sorted(rows, key=lambda r: list(MECHANISMS).index(r.finding))
  return decide(rows)


def _rows_saturation(sweep: str, effects: Mapping[str, Any], suffix: str = "", *,
                     seeds: int) -> list[Row]:
  """S and K of one sweep (or one variant's runs): beside claims 1, 3 and 8."""
  headroom, spread = effects.get(f"headroom{suffix}"), effects.get(f"asymptote_spread{suffix}")
  if headroom is None or spread is None:
    return []
  return [sign_row("S", sweep, "fitted asymptote minus final value, mean over runs",
                    headroom, seeds=seeds),
          margin_row("K", sweep, "largest minus smallest fitted asymptote across n", spread,
                      seeds=seeds, note=f"margin {EQUIVALENCE_MARGIN}")]


def _number(x: float) -> str:
  return "nan" if not math.isfinite(x) else f"{x:+.3f}"


def _p(x: float) -> str:
  """A bootstrap p-value (`bootstrap.p_value`: never 0, its floor 2 / (Z + 1))."""
  return f"{x:.3f}" if math.isfinite(x) else ""


def to_markdown(rows: list[Row], claim: str = "the paper's claim") -> str:
  """The table: finding, the claim, what was measured, effect [interval], the raw and
  Holm-adjusted p-values, the fewest seeds per allocation, verdict, note."""
  lines = [f"| # | {claim} | sweep | measured | effect [90% CI] | p | Holm p (look) | "
           "seeds | verdict | note |", "|---|---|---|---|---|---|---|---|---|---|"]
  for r in rows:
    e = r.effect
    look = f" ({r.look})" if r.look and math.isfinite(r.p_adjusted) else ""
    lines.append(f"| {r.finding} | {r.claim} | {r.sweep} | {r.measured} | "
                 f"{_number(e['value'])} [{_number(e['lo'])}, {_number(e['hi'])}] | "
                 f"{_p(r.p)} | {_p(r.p_adjusted)}{look} | "
                 f"{r.seeds or 'runs'} | "
                 f"**{r.verdict}** | {r.note} |")
  return "\n".join(lines) + "\n"


def seed_markdown(experiments: Mapping[str, Mapping[str, Any]]) -> str:
  """Per sweep, each allocation measured with several seeds: each metric's final values,
  mean and standard deviation over seeds (the run-to-run spread every claim has to
  beat), one row per allocation."""
  rows: dict[tuple[str, int, int], dict[str, Any]] = {}
  names: list[str] = []
  for name, exp in experiments.items():
    for s in (exp.get("details") or {}).get("seed_spread", []):
      sweep = f"{name}/{s['variant']}" if s["variant"] else name
      key = (sweep, s["problems_per_batch"], s["rollouts_per_problem"])
      rows.setdefault(key, {"seeds": len(s["seeds"])})[s["metric"]] = s
      if s["metric"] not in names:
        names.append(s["metric"])
  if not rows:
    return ""
  def cell(s):
    finals = ", ".join(f"{x:.3f}" for x in s["finals"]) if s else ""
    return f"{s['mean']:.3f} ± {s['sd']:.3f} ({finals})" if s else ""

  lines = ["| sweep | B_p | n | seeds | " + " | ".join(
               f"{m}: mean ± SD (finals)" for m in names) + " |",
           "|---|---|---|---|" + "---|" * len(names)]
  for (sweep, b_p, n), r in rows.items():
    lines.append(f"| {sweep} | {b_p} | {n} | {r['seeds']} | "
                 + " | ".join(cell(r.get(m)) for m in names) + " |")
  return "\n".join(lines) + "\n"


def read_experiments(study_dir: str) -> dict[str, dict[str, Any]]:
  """{sweep name: experiment} for every DIR/<sweep>/experiment.json of a study, each with
  `earlier_looks`: the experiments of DIR/<sweep>/earlier_looks.json (none: [])."""
  root = storage.path(study_dir)
  if not root.is_dir():
    raise FileNotFoundError(f"study directory {study_dir!r} does not exist")
  found = {}
  for sub in sorted(p for p in root.iterdir() if p.is_dir()):
    path = sub / EXPERIMENT_FILE
    if path.is_file():
      looks = sub / LOOKS_FILE
      found[sub.name] = dict(storage.read_json(path), earlier_looks=(
          storage.read_json(looks) if looks.is_file() else []))
  return found


def record_look(sweep_dir: str, new_experiment: Mapping[str, Any]) -> None:
  """Before `new_experiment` replaces DIR/experiment.json: when the old one was read at a
  smaller budget (an earlier look at runs since extended), append it to
  DIR/earlier_looks.json, so the family of the primary claims keeps every look."""
  old_path = storage.path(os.path.join(sweep_dir, EXPERIMENT_FILE))
  if not old_path.is_file():
    return
  old = storage.read_json(old_path)
  old_end, new_end = old.get("compute_end"), new_experiment.get("compute_end")
  if old_end is None or new_end is None or old_end >= new_end:
    return
  looks_path = os.path.join(sweep_dir, LOOKS_FILE)
  looks = storage.read_json(looks_path) if storage.path(looks_path).is_file() else []
  if all(look.get("compute_end") != old_end for look in looks):
    storage.write_json(looks_path, looks + [old])


_HEADER = """\
Each effect: the estimate on the runs as measured and its 90% interval from a
hierarchical bootstrap (each allocation's seeds, then the validation problems). Claims
1, 2a and 2b are the primary family: p is the two-sided bootstrap p-value of "no
effect", Holm p is adjusted over every primary row of this study and of earlier looks at
the same runs, and a primary verdict is yes (no) when Holm p < 0.10 with the estimate on
the paper's (the other) side. The other rows follow their intervals: yes when the
interval lies strictly on the paper's side of 0, no when strictly on the other side,
inconclusive when it touches or straddles 0; "barely matters" rows compare with the one
margin {margin}. `seeds` is the fewest seeds of an allocation the row compares: with one,
the interval omits run-to-run variance and the verdict is indicative, never yes or no.
"""


def write_study_findings(study_dir: str, *, seed: int = 0) -> tuple[list[Row], str]:
  """The findings table of a study directory, written to DIR/findings.md."""
  experiments = read_experiments(study_dir)
  if not experiments:
    raise FileNotFoundError(f"no <sweep>/{EXPERIMENT_FILE} under {study_dir!r}: run the "
                            "study (python -m launch.study) first")
  rows = table(experiments, seed=seed)
  text = (f"# Findings of {os.path.basename(os.path.normpath(study_dir))}\n\n"
          + _HEADER.format(margin=EQUIVALENCE_MARGIN).replace("\n", " ").strip() + "\n\n"
          + to_markdown(rows))
  mechanisms = mechanism_table(experiments)
  if mechanisms:
    text += ("\n## What the verdicts rest on\n\nMeasured the same way, beside the claims: "
             "whether training transfers across problems (then covering each problem "
             "matters less than the paper's setting assumes), whether the runs had "
             "saturated when the budget ran out, and whether every n heads for one "
             "ceiling.\n\n" + to_markdown(mechanisms, "what is tested"))
  spread = seed_markdown(experiments)
  if spread:
    text += ("\n## Seed spread\n\nEach allocation run with several seeds: its final "
             "values (each run's last evaluation) over seeds.\n\n" + spread)
  uncorrected = [f"{name}{'/' + u['variant'] if u['variant'] else ''} {u['metric']} "
                 f"(B_p = {u['problems_per_batch']}, n = {u['rollouts_per_problem']})"
                 for name, exp in experiments.items() for u in exp.get("uncorrected_seeds", [])]
  if uncorrected:
    text += ("\n## Seeds drawn without the correction\n\nThese allocations' seeds were "
             "evaluated at different compute, so a replicate draws them as they are, "
             "without moving them by sqrt(k / (k - 1)); intervals over them cover less "
             f"than {bootstrap.DEFAULT_LEVEL:.0%}: " + "; ".join(uncorrected) + ".\n")
  storage.write_text(os.path.join(study_dir, FINDINGS_FILE), text)
  return rows, text
