"""The findings table: verdicts from intervals, cross-sweep effects, markdown, files."""

import json

import numpy as np

from isojax.planner import bootstrap
from isojax.planner import findings
from isojax.planner import verdicts as verdicts_lib


def _effect(samples, value=None):
  samples = np.asarray(samples, float)
  return bootstrap.effect(float(np.median(samples)) if value is None else value, samples)


def _iso(difficulty, rise, end, best, worst, lost, errors=(), seeds=3):
  return {"kind": "iso_compute", "difficulty": difficulty, "variants": [],
          "fewest_seeds": seeds,
          "effects": {"n_star_rise": _effect(rise), "log2_n_star_end": _effect(end),
                      "log2_n_saturation": _effect(end),
                      "best_slope_log2_n": _effect(best), "worst_slope_log2_n": _effect(worst),
                      "lost_slope_log2_n": _effect(lost)},
          "extrapolation": [{"error": e} for e in errors], "details": {}}


def test_verdicts_follow_the_intervals():
  rng = np.random.default_rng(0)
  hard = _iso("hard", rise=rng.normal(2.0, 0.3, 200), end=rng.normal(3.0, 0.1, 200),
              best=rng.normal(0.02, 0.005, 200), worst=rng.normal(0.0, 0.01, 200),
              lost=rng.normal(-0.03, 0.01, 200), errors=[0.01, -0.005, 0.002, 0.004])
  easy = _iso("easy", rise=rng.normal(0.2, 0.5, 200), end=rng.normal(5.0, 0.1, 200),
              best=rng.normal(0.0, 0.01, 200), worst=rng.normal(-0.02, 0.005, 200),
              lost=rng.normal(0.01, 0.02, 200), errors=[0.003, 0.001])
  decoupled = {"kind": "decoupled_baseline", "difficulty": "hard", "variants": [],
               "fewest_seeds": 2,
               "effects": {"decoupled_minus_plain_train": _effect(rng.normal(0.03, 0.01, 200)),
                           "plain_estimate_minus_decoupled": _effect(rng.normal(-0.02, 0.005,
                                                                                200))},
               "extrapolation": [], "details": {}}
  bp = {"kind": "problems_per_batch", "difficulty": "easy", "variants": [],
        "fewest_seeds": 3,
        "effects": {"spread": _effect(rng.uniform(0.0, 0.015, 200)),
                    "volatility_smallest_bp": _effect([0.02] * 10),
                    "volatility_largest_bp": _effect([0.01] * 10)},
        "extrapolation": [], "details": {}}
  rows = findings.table({"hard": hard, "easy": easy, "decoupled": decoupled, "bp": bp})
  verdicts = {(r.finding, r.sweep): r.verdict for r in rows}
  assert verdicts == {
      ("1", "hard"): "yes", ("1", "easy"): "inconclusive",
      ("2a", "hard"): "yes", ("2b", "easy"): "no", ("2c", "hard - easy"): "yes",
      ("4", "bp"): "yes", ("5", "hard"): "yes", ("5", "easy"): "inconclusive",
      ("7a", "decoupled"): "yes", ("7b", "decoupled"): "no", ("9", "all"): "yes"}
  assert [r.finding for r in rows] == sorted([r.finding for r in rows],
                                             key=list(verdicts_lib.CLAIMS).index)
  (c,) = [r for r in rows if r.finding == "2c"]
  assert abs(c.effect["value"] - (hard["effects"]["log2_n_star_end"]["value"]
                                   - easy["effects"]["log2_n_star_end"]["value"])) < 1e-12
  (nine,) = [r for r in rows if r.finding == "9"]
  assert nine.effect["value"] == np.median(np.abs([0.01, -0.005, 0.002, 0.004, 0.003, 0.001]))
  assert "frontier" not in nine.note
  hard["frontier_extrapolation"] = {"": {"error": -0.0123}}
  (nine,) = [r for r in findings.table({"hard": hard}) if r.finding == "9"]
  assert nine.note.endswith("predicted - observed: hard -0.012")


def test_a_set_swept_at_two_budgets_gets_a_row_for_each():
  rng = np.random.default_rng(2)
  hard = _iso("hard", [1.0] * 5, [4.0] * 5, rng.normal(0.02, 0.002, 200), [0.0] * 5, [0.0] * 5)
  short = _iso("easy", [1.0] * 5, [1.0] * 5, [0.0] * 5, rng.normal(-0.1, 0.01, 200), [0.0] * 5)
  long = _iso("easy", [1.0] * 5, [3.0] * 5, [0.0] * 5, rng.normal(0.03, 0.01, 200), [0.0] * 5)
  rows = findings.table({"hard": hard, "easy": short, "easy_long": long})
  verdicts = {(r.finding, r.sweep): r.verdict for r in rows if r.finding in ("2b", "2c")}
  assert verdicts == {("2b", "easy"): "no", ("2b", "easy_long"): "yes",
                      ("2c", "hard - easy"): "no", ("2c", "hard - easy_long"): "no"}
  (c,) = [r for r in rows if r.sweep == "hard - easy_long"]
  assert c.effect["value"] == 1.0  # 4 doublings minus 3


def test_extrapolation_verdict_against_the_tolerance():
  exp = _iso("hard", [1.0] * 5, [1.0] * 5, [0.0] * 5, [0.0] * 5, [0.0] * 5,
             errors=[0.05, -0.06, 0.07, 0.08, -0.05, 0.09])
  (nine,) = [r for r in findings.table({"h": exp}) if r.finding == "9"]
  assert nine.verdict == "no" and nine.effect["lo"] > verdicts_lib.EQUIVALENCE_MARGIN


def test_mechanisms_transfer_saturation_and_ceilings_follow_their_intervals():
  rng = np.random.default_rng(1)
  hard = _iso("hard", [1.0] * 5, [1.0] * 5, [0.0] * 5, [0.0] * 5, [0.0] * 5)
  hard["effects"].update(headroom=_effect(rng.normal(0.08, 0.01, 200)),
                         asymptote_spread=_effect(rng.uniform(0.0, 0.01, 200)))
  easy = _iso("easy", [1.0] * 5, [1.0] * 5, [0.0] * 5, [0.0] * 5, [0.0] * 5)
  easy["effects"].update(headroom=_effect(rng.normal(0.0, 0.02, 200)),
                         asymptote_spread=_effect(rng.normal(0.1, 0.01, 200)))
  sizes = {"kind": "problem_set_size", "variants": [], "extrapolation": [],
           "details": {"sizes": {"all": None, "p16": 16, "p64": 64}},
           "effects": {"transfer_gain": _effect(rng.normal(0.2, 0.02, 200)),
                       "transfer_fraction": _effect(rng.normal(0.9, 0.05, 200))}}
  fixed = dict(_iso("", [1.0] * 5, [1.0] * 5, [0.0] * 5, [0.0] * 5, [0.0] * 5),
               kind="fixed_batch")
  fixed["effects"].update(headroom=_effect(rng.normal(-0.05, 0.01, 200)),
                          asymptote_spread=_effect(rng.normal(0.0, 0.005, 200)))
  algorithms = {"kind": "algorithms", "variants": ["cispo", "pods"], "extrapolation": [],
                "details": {}, "effects": {
                    "headroom_cispo": _effect(rng.normal(0.1, 0.01, 200)),
                    "asymptote_spread_cispo": _effect(rng.normal(0.3, 0.01, 200)),
                    "headroom_pods": _effect(rng.normal(0.0, 0.05, 200)),
                    "asymptote_spread_pods": _effect(rng.normal(0.0, 0.05, 200))}}
  for exp in (sizes, algorithms):
    exp["fewest_seeds"] = 3
  rows = findings.mechanism_table({"hard": hard, "easy": easy, "sizes": sizes,
                                   "fixed": fixed, "alg": algorithms})
  verdicts = {(r.finding, r.sweep): r.verdict for r in rows}
  assert verdicts == {("T", "sizes"): "yes", ("S", "hard"): "yes",
                      ("S", "easy"): "inconclusive", ("K", "hard"): "yes",
                      ("K", "easy"): "no", ("S", "fixed"): "no", ("K", "fixed"): "yes",
                      ("S", "alg/cispo"): "yes", ("K", "alg/cispo"): "no",
                      ("S", "alg/pods"): "inconclusive", ("K", "alg/pods"): "inconclusive"}
  (t,) = [r for r in rows if r.finding == "T"]
  f = sizes["effects"]["transfer_fraction"]
  assert "16 problems" in t.measured  # the smallest set of the sweep
  assert t.note == (f"fraction of the full set's gain {f['value']:+.3f} "
                    f"[{f['lo']:+.3f}, {f['hi']:+.3f}]")
  assert [r.finding for r in rows] == sorted([r.finding for r in rows],
                                             key=list(verdicts_lib.MECHANISMS).index)
  assert "what is tested" in findings.to_markdown(rows, "what is tested")


def test_study_directory_to_markdown(tmp_path):
  exp = _iso("hard", [1.0, 2.0, 1.5], [2.0] * 3, [0.01] * 3, [0.0] * 3, [0.0] * 3)
  exp["effects"]["n_star_rise"]["value"] = None  # as JSON holds a NaN
  (tmp_path / "hard").mkdir()
  (tmp_path / "hard" / findings.EXPERIMENT_FILE).write_text(json.dumps(exp))
  rows, text = findings.write_study_findings(str(tmp_path))
  assert (tmp_path / findings.FINDINGS_FILE).read_text() == text
  table_lines = [l for l in text.splitlines() if l.startswith("| ")]
  assert len(table_lines) == 1 + len(rows)
  assert "## Seed spread" not in text  # no allocation with several seeds
  assert "without the correction" not in text
  (one,) = [r for r in rows if r.finding == "1"]
  # Its interval is [1.05, 1.95], but a primary verdict needs the estimate on the runs
  # as measured: undefined there, it decides nothing.
  assert np.isnan(one.effect["value"]) and one.verdict == "inconclusive"
  assert "| 1 | n*(C) grows" in text and "nan [+1.0" in text


def test_allocations_drawn_without_the_seed_correction_are_named(tmp_path):
  exp = _iso("hard", [1.0, 2.0, 1.5], [2.0] * 3, [0.01] * 3, [0.0] * 3, [0.0] * 3)
  exp["uncorrected_seeds"] = [dict(variant="", metric="val/best@4", problems_per_batch=8,
                                   rollouts_per_problem=32)]
  (tmp_path / "hard").mkdir()
  (tmp_path / "hard" / findings.EXPERIMENT_FILE).write_text(json.dumps(exp))
  _, text = findings.write_study_findings(str(tmp_path))
  assert text.endswith("## Seeds drawn without the correction\n\nThese allocations' seeds "
                       "were evaluated at different compute, so a replicate draws them as "
                       "they are, without moving them by sqrt(k / (k - 1)); intervals over "
                       "them cover less than 90%: hard val/best@4 (B_p = 8, n = 32).\n")


def test_one_seed_per_allocation_is_indicative_whatever_the_interval():
  rng = np.random.default_rng(5)
  for seeds in (1, None):  # None: an experiment written before seeds were counted
    hard = _iso("hard", rng.normal(2.0, 0.3, 200), [3.0] * 5, rng.normal(0.02, 0.005, 200),
                [0.0] * 5, rng.normal(-0.03, 0.01, 200), seeds=seeds)
    rows = findings.table({"hard": hard})
    assert {r.finding: r.verdict for r in rows} == {
        "1": "indicative", "2a": "indicative", "5": "indicative"}
    (two_a,) = [r for r in rows if r.finding == "2a"]
    assert two_a.note.startswith("one seed per allocation: the interval omits seed variance; "
                                 "it lies on the paper's side of 0")
    assert two_a.seeds == 1


def test_the_primary_family_is_holm_adjusted_across_sweeps_and_looks():
  """Three primary rows whose raw p-values are 0.02, 0.04 and 0.06 (replicates placed so),
  plus one earlier look at p = 0.01: Holm over four tests, by hand."""
  def samples(p):  # 199 replicates, k of them at or below 0: p = 2 (k + 1) / 200
    k = int(round(100 * p)) - 1
    return [-0.01] * k + [0.05] * (199 - k)

  def iso(rise_p, best_p):
    return _iso("hard", samples(rise_p), [3.0] * 5, samples(best_p), [0.0] * 5, [0.0] * 5)

  current = iso(0.02, 0.04)
  current["effects"]["n_star_rise"]["value"] = 1.0
  current["effects"]["best_slope_log2_n"]["value"] = 0.02
  other = iso(0.06, 0.5)
  other["effects"]["n_star_rise"]["value"] = 1.0
  other["effects"].pop("best_slope_log2_n")
  current["earlier_looks"] = [dict(iso(0.01, 1.0), compute_end=1.0)]
  current["earlier_looks"][0]["effects"].pop("best_slope_log2_n")
  rows = {(r.finding, r.sweep): r for r in findings.table({"h": current, "o": other})}
  raw = {k: r.p for k, r in rows.items() if r.primary}
  assert raw == {("1", "h"): 0.02, ("2a", "h"): 0.04, ("1", "o"): 0.06}
  # sorted: 0.01 (x4 = 0.04, the earlier look), 0.02 (x3 = 0.06), 0.04 (x2 = 0.08),
  # 0.06 (x1, but at least 0.08)
  adjusted = {k: round(r.p_adjusted, 6) for k, r in rows.items() if r.primary}
  assert adjusted == {("1", "h"): 0.06, ("2a", "h"): 0.08, ("1", "o"): 0.08}
  assert all(r.verdict == "yes" for r in rows.values() if r.primary)
  assert rows[("1", "h")].look == "2 of 2" and rows[("1", "o")].look == ""
  # A fifth test in the family (p = 0.5) lifts 0.02's adjusted p to 0.02 x 4 = 0.08
  # (still < 0.1) and 0.04's to 0.04 x 3 = 0.12: no longer a yes.
  current["earlier_looks"].append(dict(iso(0.5, 1.0), compute_end=2.0))
  current["earlier_looks"][1]["effects"].pop("best_slope_log2_n")
  rows = {(r.finding, r.sweep): r for r in findings.table({"h": current, "o": other})}
  assert round(rows[("2a", "h")].p_adjusted, 6) == 0.12
  assert round(rows[("1", "h")].p_adjusted, 6) == 0.08
  assert rows[("2a", "h")].verdict == "inconclusive" and rows[("1", "h")].verdict == "yes"
  assert rows[("1", "h")].look == "3 of 3"


def test_an_effect_defined_in_too_few_replicates_has_no_p_value_and_decides_nothing():
  """n*'s rise has a value in 80 of 200 replicates, all +1 (in the rest no fit rose): its
  interval is undefined (fewer than `bootstrap.MIN_DEFINED` of them), and so is its
  p-value, so the row stays inconclusive. A p-value over the 80 alone, 2 / 81, would be
  0.049 after Holm over the hard sweep's two primary rows: a yes beside an interval of
  [nan, nan]. With 120 of 200 the interval exists and p = 2 / 121 decides."""
  def rows(defined):
    rise = _effect([1.0] * defined + [np.nan] * (200 - defined), value=1.0)
    hard = _iso("hard", [0.0] * 5, [3.0] * 5, [0.0] * 5, [0.0] * 5, [0.0] * 5)
    hard["effects"]["n_star_rise"] = rise
    return {r.finding: r for r in findings.table({"hard": hard})}
  few = rows(80)["1"]
  assert np.isnan(few.effect["lo"]) and np.isnan(few.p) and few.verdict == "inconclusive"
  enough = rows(120)["1"]
  assert enough.p == 2 / 121 and enough.p_adjusted == 2 * 2 / 121
  assert enough.verdict == "yes"


def test_too_few_replicates_for_the_family_leave_a_clear_effect_inconclusive_and_say_so():
  """Six sweeps, two primary rows each (a family of 12), every replicate far above 0:
  200 replicates give p = 2 / 201 and Holm 12 x that = 0.119, so nothing is decided and
  each row names the 240 replicates it would take; 240 decide every row."""
  def six(z):
    return {f"s{i}": _iso("hard", [2.0] * z, [3.0] * 5, [0.02] * z, [0.0] * 5, [0.0] * 5)
            for i in range(6)}
  rows = [r for r in findings.table(six(200)) if r.primary]
  assert len(rows) == 12 and {r.verdict for r in rows} == {"inconclusive"}
  assert rows[0].p_adjusted == 12 * 2 / 201
  assert all("200 bootstrap replicates cannot decide a family of 12" in r.note
             and "at least 240" in r.note for r in rows), rows[0].note
  rows = [r for r in findings.table(six(240)) if r.primary]
  assert {r.verdict for r in rows} == {"yes"} and not any("replicates" in r.note for r in rows)


def test_a_look_is_recorded_when_a_larger_budget_replaces_it(tmp_path):
  sweep = str(tmp_path)
  def write(end):
    (tmp_path / findings.EXPERIMENT_FILE).write_text(json.dumps({"compute_end": end, "x": end}))
  write(100.0)
  findings.record_look(sweep, {"compute_end": 100.0})   # a re-read at the same budget
  assert not (tmp_path / findings.LOOKS_FILE).exists()
  findings.record_look(sweep, {"compute_end": 400.0})
  write(400.0)
  findings.record_look(sweep, {"compute_end": 1600.0})
  findings.record_look(sweep, {"compute_end": 1600.0})  # twice: recorded once
  looks = json.loads((tmp_path / findings.LOOKS_FILE).read_text())
  assert [look["x"] for look in looks] == [100.0, 400.0]
  (tmp_path / "s").mkdir()
  (tmp_path / "s" / findings.EXPERIMENT_FILE).write_text(json.dumps({"compute_end": 9.0}))
  (tmp_path / "s" / findings.LOOKS_FILE).write_text(json.dumps(looks))
  assert findings.read_experiments(str(tmp_path))["s"]["earlier_looks"] == looks
