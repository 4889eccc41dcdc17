"""The findings table: verdicts from intervals, cross-sweep effects, markdown, files."""

import json

import numpy as np

from isojax.planner import bootstrap
from isojax.planner import findings


def _effect(samples, value=None):
  samples = np.asarray(samples, float)
  return bootstrap.effect(float(np.median(samples)) if value is None else value, samples)


def _iso(difficulty, rise, end, best, worst, extreme, errors=()):
  return {"kind": "iso_compute", "difficulty": difficulty, "variants": [],
          "effects": {"n_star_rise": _effect(rise), "log2_n_star_end": _effect(end),
                      "log2_n_saturation": _effect(end),
                      "best_slope_log2_n": _effect(best), "worst_slope_log2_n": _effect(worst),
                      "extreme_change_slope_log2_n": _effect(extreme)},
          "extrapolation": [{"error": e} for e in errors], "details": {}}


def test_verdicts_follow_the_intervals():
  rng = np.random.default_rng(0)
  hard = _iso("hard", rise=rng.normal(2.0, 0.3, 200), end=rng.normal(3.0, 0.1, 200),
              best=rng.normal(0.02, 0.005, 200), worst=rng.normal(0.0, 0.01, 200),
              extreme=rng.normal(-0.03, 0.01, 200), errors=[0.01, -0.005, 0.002, 0.004])
  easy = _iso("easy", rise=rng.normal(0.2, 0.5, 200), end=rng.normal(5.0, 0.1, 200),
              best=rng.normal(0.0, 0.01, 200), worst=rng.normal(-0.02, 0.005, 200),
              extreme=rng.normal(0.01, 0.02, 200), errors=[0.003, 0.001])
  decoupled = {"kind": "decoupled_baseline", "difficulty": "hard", "variants": [],
               "effects": {"decoupled_minus_plain_train": _effect(rng.normal(0.03, 0.01, 200)),
                           "plain_estimate_minus_decoupled": _effect(rng.normal(-0.02, 0.005,
                                                                                200))},
               "extrapolation": [], "details": {}}
  bp = {"kind": "problems_per_batch", "difficulty": "easy", "variants": [],
        "effects": {"spread": _effect(rng.uniform(0.01, 0.03, 200)),
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
                                             key=list(findings.CLAIMS).index)
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
  assert nine.verdict == "no" and nine.effect["lo"] > findings.EXTRAPOLATION_TOLERANCE


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
                                             key=list(findings.MECHANISMS).index)
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
  (one,) = [r for r in rows if r.finding == "1"]
  assert np.isnan(one.effect["value"]) and one.verdict == "yes"  # interval [1.05, 1.95]
  assert "| 1 | n*(C) grows" in text and "nan [+1.0" in text
