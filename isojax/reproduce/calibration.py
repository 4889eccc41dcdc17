"""The calibration section: the verdict machinery on synthetic sweeps with known truths
(`isojax.planner.calibration`): how often the 90% intervals cover the true slope, how
often a null family yields a yes or a no, and how often a planted slope is found."""

from __future__ import annotations

import dataclasses
import time

from isojax.planner import calibration
from isojax.reproduce import per_problem, tables
from isojax.tools import target_calibration

STUDIES, RESAMPLES = 400, 200
_NOISY = dict(eval_sd=0.3, problems=64)   # evaluation noise as large as seed variance


def _coverage_rows() -> list[str]:
  base = calibration.Model()
  cases = (("3 seeds, seeds then problems (the study's bootstrap)", base, False),
           ("3 seeds, seeds drawn without the variance correction", base, True),
           ("1 seed (problems only: an indicative row)", dataclasses.replace(base, seeds=1),
            False),
           ("3 seeds, evaluation noise as large as seed variance (64 problems, "
            "per-problem SD 0.3)", dataclasses.replace(base, **_NOISY), False))
  rates = [calibration.coverage(model, studies=STUDIES, resamples=RESAMPLES, plain=plain)
           for _, model, plain in cases]
  return [f"| {name} | {rate:.3f} |" for (name, _, _), rate in zip(cases, rates)]


FRONTIER_STUDIES, FRONTIER_RESAMPLES = 100, 100   # 13 sigmoid fits per replicate
_FRONTIER_CASES = (
    ("n* rises from 4 to 64, the largest n (censored at the grid's edge)", {}),
    ("n* rises from 4 to 16 (the asymptote stops growing past n = 8)",
     dict(gain_stops_at=3.0)),
    ("null: every n on one curve", dict(gain_per_doubling=0.0, delay_exponent=0.0)))


def _frontier_rows() -> list[str]:
  rows = []
  for name, fields in _FRONTIER_CASES:
    r = calibration.frontier_rates(calibration.FrontierModel(**fields),
                                   studies=FRONTIER_STUDIES, resamples=FRONTIER_RESAMPLES)
    rows.append(f"| {name} | {r.truth:+.2f} | {r.mean_estimate:+.2f} | {r.coverage:.3f} | "
                f"{r.decided:.3f} | {r.undefined:.3f} |")
  return rows


TTV_STUDIES, TTV_RESAMPLES = 200, 200
_TTV_CASES = (("per-problem reaches every value 2x sooner, 3 seeds", 2.0, 3),
              ("2x sooner, 5 seeds", 2.0, 5),
              ("1.5x sooner, 3 seeds", 1.5, 3),
              ("null: both arms on one curve, 3 seeds", 1.0, 3),
              ("null, 5 seeds", 1.0, 5))


def _time_to_value_rows() -> list[str]:
  rows = []
  for name, speedup, seeds in _TTV_CASES:
    model = calibration.TimeToValueModel(speedup=speedup, frontier=dataclasses.replace(
        calibration.TimeToValueModel().frontier, seeds=seeds))
    r = calibration.time_to_value_rates(model, studies=TTV_STUDIES, resamples=TTV_RESAMPLES)
    rows.append(f"| {name} | {r.truth:+.2f} | {r.mean_estimate:+.2f} | {r.coverage:.3f} | "
                f"{r.decided:.3f} | {r.undefined:.3f} |")
  return rows


TARGET_STUDIES = 400
_TARGET_CASES = (
    ("null: one curve for both arms, 5 seeds, 11 evaluations", {}),
    ("null, no gain at all (the base model's level plus noise)", dict(gain=0.0)),
    ("null, evaluation SD 0.03", dict(eval_sd=0.03)),
    ("the candidate 2x sooner", dict(speedup=2.0)),
    ("1.25x sooner", dict(speedup=1.25)),
    ("2x sooner, evaluation SD 0.03", dict(speedup=2.0, eval_sd=0.03)),
    ("null, 3 seeds, 5 evaluations (SmolLM2's design)", dict(seeds=3, evaluations=5)),
    ("2x sooner, 3 seeds, 5 evaluations", dict(speedup=2.0, seeds=3, evaluations=5)))


def _target_rows() -> list[str]:
  rows = []
  for name, fields in _TARGET_CASES:
    r = target_calibration.rates(target_calibration.TargetModel(**fields),
                                 studies=TARGET_STUDIES, level=per_problem.LEVEL)
    rows.append(f"| {name} | {r.truth:.2f} | {r.mean_estimate:.2f} | {r.coverage:.3f} | "
                f"{r.yes:.3f} | {r.no:.3f} | {r.undefined:.3f} |")
  return rows


def _target_section() -> list[str]:
  m = target_calibration.TargetModel()
  return [
      "## The testbeds' ratio: rollouts to the baseline's peak, per seed", "",
      "`isojax.tools.target_calibration.TargetModel`: per seed one baseline and one "
      "candidate run (the per_problem sections' design), each a curve rising from "
      f"{m.base} by a gain of {m.gain} (1 - exp(-3 c / C)) with its own level of gain (SD "
      f"{m.seed_sd}) and evaluation noise (SD {m.eval_sd}) unless a row says otherwise; "
      "the candidate's curve is the baseline's at a known multiple of its compute; both "
      "arms share the first evaluation. The truth is the statistic on the noiseless "
      "curves (the saving rounded up to the next evaluation; 1 with none); the statistic "
      "is `time_to_target.compare` and `ratio_effect` at the sections' level "
      f"({per_problem.LEVEL:.1%}), decided by `speedup_verdict` against 1, over "
      f"{TARGET_STUDIES} testbeds. yes and no are rates over the testbeds where the "
      "statistic is defined (under a null both are errors; nominal 1 - level together); "
      "undefined: some seed's baseline peaked at its first evaluation.", "",
      "| truth | true ratio | geometric mean estimate | coverage | yes | no | undefined |",
      "|---|---|---|---|---|---|---|", *_target_rows(), ""]


def run(inv: tables.Invocation) -> str:
  """calibration.md; returns its path."""
  start = time.time()
  coverage = _coverage_rows()
  null = [calibration.Model(slope=0.0)] * 3
  adjusted, raw = calibration.family_error(null, studies=STUDIES, resamples=RESAMPLES)
  powers = [(s, calibration.power(calibration.Model(slope=s), studies=STUDIES // 2,
                                  resamples=RESAMPLES)) for s in (0.01, 0.02)]
  frontier = _frontier_rows()
  time_to_value = _time_to_value_rows()
  m, f = calibration.Model(), calibration.FrontierModel()
  t = calibration.TimeToValueModel().frontier
  body = "\n".join([
      "Synthetic iso-compute sweeps (`isojax.planner.calibration.Model`): "
      f"{len(m.problems_per_batch) * len(m.rollouts_per_problem)} allocations (B_p in "
      f"{m.problems_per_batch}, n in {m.rollouts_per_problem}), {m.problems} validation "
      f"problems, a run's final value = 0.3 + (slope + v_g) log2 n + seed effect + "
      f"evaluation noise, with seed SD {m.seed_sd}, per-problem slope SD {m.problem_sd} and "
      f"per-problem evaluation SD {m.eval_sd} unless a row says otherwise. Each rate is "
      f"over {STUDIES} synthetic studies of {RESAMPLES} bootstrap replicates each, through "
      "the study's own code (`bootstrap.bootstrap`, `bootstrap.p_value`, `bootstrap.holm`, "
      "`experiments.final_slope_log2_n`: the statistic of claims 2a, 2b and 5).", "",
      "## Coverage of the 90% interval of a slope (nominal 0.90)", "",
      "| design | coverage |", "|---|---|", *coverage, "",
      "## A null family: three primary tests, no effect of n (nominal family-wise rate "
      "0.10)", "",
      "| decision rule | studies with any yes or no |", "|---|---|",
      f"| Holm-adjusted p < 0.10 (the study's rule) | {adjusted:.3f} |",
      f"| raw p < 0.10 | {raw:.3f} |", "",
      "## Power: a planted slope found (yes) at Holm-adjusted p < 0.10 in a family of three",
      "", "| true slope per doubling of n | found |", "|---|---|",
      *[f"| {s} | {p:.3f} |" for s, p in powers], "",
      "## Claim 1: n*'s rise over the compute frontier, on sweeps with a known n*(C)", "",
      "`calibration.FrontierModel`: the same 12 allocations and 3 seeds, each allocation's "
      f"mean curve the ScaleRL sigmoid (R0 {f.r0}, asymptote {f.asymptote} + "
      f"{f.gain_per_doubling} log2 n, B {f.b}, C_mid {f.c_mid:g} n^{f.delay_exponent}) "
      f"evaluated {f.evaluations} times up to C = {f.budget:,.0f}, plus a run's level (SD "
      f"{f.seed_sd}), a problem's difficulty (SD {f.problem_sd}) and evaluation noise (SD "
      f"{f.eval_sd}). The truth is the claim's rule on the true curves "
      "(`calibration.true_rise`); the statistic is `n_star.frontier_stats` (a "
      f"sigmoid fit per allocation, n* among near-ties) over {FRONTIER_STUDIES} studies of "
      f"{FRONTIER_RESAMPLES} replicates each. \"decided\" is the rate of yes (planted) or "
      "of any yes or no (null) at raw p < 0.10: the power, or the error of one test "
      "before the family's Holm adjustment, which only makes it stricter.", "",
      "| truth | true rise (doublings) | mean estimate | coverage of the 90% interval | "
      "decided | statistic undefined |", "|---|---|---|---|---|---|", *frontier, "",
      "## Claim 10: per-problem allocation's compute to the uniform frontier's best value",
      "", "`calibration.TimeToValueModel`: a `per_problem` sweep of configs/"
      f"sweep_per_problem.py's design (B_p {t.problems_per_batch[0]}, n in "
      f"{t.rollouts_per_problem}, both arms), the uniform arm's curves those above and the "
      "per-problem arm's the same curves reached a known factor sooner, evaluated on the "
      "same problems. The truth is the statistic on the true curves "
      "(`calibration.true_log2_ratio`: log2 of the saving, on this evaluation grid); the "
      "statistic is `time_to_value.per_problem_stats` over "
      f"{TTV_STUDIES} studies of {TTV_RESAMPLES} replicates each, decided as the findings "
      "row is (the interval strictly below 0: yes). \"decided\" is the rate of yes "
      "(planted) or of any yes or no (null); \"never reached\" the rate at which no "
      "per-problem allocation reached the target, where the arm's largest compute stands "
      "in (a bound).", "",
      "| truth | true log2 ratio | mean estimate | coverage of the 90% interval | decided | "
      "never reached |", "|---|---|---|---|---|---|", *time_to_value, "",
      *_target_section()])
  return tables.write(inv, "calibration.md", "Calibration: the verdict machinery on "
                      "synthetic truths", time.time() - start, body)
