"""Verdicts: the claims, the rows that hold their effects, and the rules that decide them.

The analysis is fixed before the runs (docs/study.md, "How a claim is decided"):

- a verdict follows the effect's hierarchical bootstrap interval (seeds, then problems),
  never its point value; one that compares allocations measured with one seed each is
  `bootstrap.INDICATIVE`: its interval omits run-to-run variance;
- claims 1, 2a and 2b are the primary family: each gets a two-sided bootstrap p-value,
  adjusted by Holm's procedure over every primary row of the study and of the earlier
  looks at its runs (an extension re-reads the same runs: one family), and is decided
  at adjusted p < 0.10; the rest are secondary, decided by their 90% intervals;
- "barely matters" claims (4, 9 and K) share one equivalence margin.

`isojax.planner.findings` builds the rows from a study's experiments and writes them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import numpy as np

from isojax.planner import bootstrap

# The one practical-equivalence margin (accuracy units) of every "barely matters"
# claim: B_p's spread of final avg@k (claim 4), a run's end predicted from its first
# half (claim 9; ScaleRL reports about +-0.02), ceilings that agree across n (K), and
# near-ties of n* (claim 1).
EQUIVALENCE_MARGIN = 0.02
PRIMARY = ("1", "2a", "2b")        # the primary family, adjusted for multiplicity
FAMILY_ALPHA = 1.0 - bootstrap.DEFAULT_LEVEL

CLAIMS = {
    "1": "n*(C) grows with C (then saturates)",
    "2a": "hard set: larger n raises best@k (coverage)",
    "2b": "easy set: larger n raises worst@k (sharpening)",
    "2c": "hard sets saturate at a smaller n than easy sets",
    "3": "at fixed batch B, n*(M) grows with the number of updates M",
    "4": "B_p barely matters (moderate range, fixed n and C)",
    "5": "larger n mitigates interference (fewer solved problems fall to pass@1 = 0)",
    "6": "small problem sets overfit: validation falls late in the run",
    "7a": "decoupled baseline (estimate from n_est, train on n_train) beats plain n_train",
    "7b": "plain n_est beats the decoupled baseline",
    "8": "the n*(C) trend holds with other RL algorithms",
    "9": "a run's end is predicted from its first half (within +-0.02)",
    "10": "per-problem allocation reaches the uniform frontier's best value with less "
          "compute",
}

# What the verdicts rest on, measured beside them (not claims of the paper): whether
# training on some problems raises others, whether the runs had reached their ceilings
# at the budget, and whether every n heads for the same ceiling.
MECHANISMS = {
    "T": "training on a few problems raises held-out ones (transfer across problems)",
    "S": "the runs were still rising when the budget ran out (not saturated)",
    "K": "every n heads for the same ceiling (the model's capacity caps the gain)",
}


@dataclasses.dataclass(frozen=True)
class Row:
  """One verdict. `verdict` is what the interval alone says; `decide` turns it into the
  reported one (indicative with one seed, Holm-adjusted for the primary family)."""
  finding: str
  sweep: str
  measured: str       # what the effect is, in words
  effect: dict[str, Any]
  verdict: str
  note: str = ""
  expected: int = 1   # the paper's side of 0 (sign claims; 0: a margin claim)
  seeds: int = 0      # the fewest seeds of an allocation compared (0: runs are the unit)
  p: float = float("nan")            # two-sided bootstrap p-value (sign claims)
  p_adjusted: float = float("nan")   # Holm's, over the primary family
  look: str = ""                     # "2 of 3": the second look at runs extended twice
  family: int = 0                    # the tests Holm adjusted over (primary rows)

  @property
  def claim(self) -> str:
    return CLAIMS.get(self.finding) or MECHANISMS[self.finding]

  @property
  def primary(self) -> bool:
    return self.finding in PRIMARY

  def to_dict(self) -> dict[str, Any]:
    e = {k: v for k, v in self.effect.items() if k != "samples"}
    return dict(finding=self.finding, claim=self.claim, sweep=self.sweep,
                measured=self.measured, effect=e, verdict=self.verdict, note=self.note,
                seeds=self.seeds, p=_json_float(self.p),
                p_adjusted=_json_float(self.p_adjusted), look=self.look)


def _json_float(x: float) -> float | None:
  return float(x) if math.isfinite(x) else None


def sign_row(finding: str, sweep: str, measured: str, e: Mapping[str, Any], *,
             expected: int = 1, seeds: int = 0, note: str = "") -> Row:
  """A row for "the effect lies on the `expected` side of 0", with its p-value."""
  return Row(finding, sweep, measured, e, bootstrap.sign_verdict(e, expected=expected), note,
             expected=expected, seeds=seeds,
             p=bootstrap.effect_p_value(e))


def margin_row(finding: str, sweep: str, measured: str, e: Mapping[str, Any], *,
               seeds: int = 0, note: str = "") -> Row:
  """A row for "the effect barely matters": within `EQUIVALENCE_MARGIN` of 0."""
  return Row(finding, sweep, measured, e, bootstrap.margin_verdict(e, EQUIVALENCE_MARGIN),
             note, expected=0, seeds=seeds)


_SIDE = {bootstrap.YES: "lies on the paper's side of 0",
         bootstrap.NO: "lies on the other side of 0",
         bootstrap.INCONCLUSIVE: "touches or straddles 0"}
_MARGIN_SIDE = {bootstrap.YES: "lies within the margin",
                bootstrap.NO: "lies outside the margin",
                bootstrap.INCONCLUSIVE: "crosses the margin"}


def _indicative(row: Row) -> Row:
  side = (_SIDE if row.expected else _MARGIN_SIDE)[row.verdict]
  note = (f"one seed per allocation: the interval omits seed variance; it {side}"
          + (f"; {row.note}" if row.note else ""))
  return dataclasses.replace(row, verdict=bootstrap.INDICATIVE, note=note)


def decide(rows: list[Row], earlier_p: Sequence[float] = ()) -> list[Row]:
  """The reported verdicts: Holm over the primary rows and `earlier_p` (the primary
  p-values of earlier looks at the same runs), each primary row decided at adjusted
  p < `FAMILY_ALPHA`; then every row resting on one seed per allocation indicative."""
  primary = [i for i, r in enumerate(rows) if r.primary]
  adjusted = bootstrap.holm([rows[i].p for i in primary] + list(earlier_p))
  out = list(rows)
  for i, p_adj in zip(primary, adjusted):
    r = rows[i]
    verdict = bootstrap.p_verdict(r.effect["value"], p_adj, alpha=FAMILY_ALPHA,
                                  expected=r.expected)
    out[i] = dataclasses.replace(r, p_adjusted=p_adj, family=len(adjusted), verdict=verdict,
                                 note=_resolution_note(r, verdict, len(adjusted)))
  return [_indicative(r) if r.seeds == 1 else r for r in out]


def _resolution_note(row: Row, verdict: str, family: int) -> str:
  """`row.note`, and why an interval clear of 0 stayed inconclusive when its replicates
  are too few for the family (`bootstrap.resamples_to_decide`)."""
  replicates = int(np.isfinite(np.asarray(row.effect.get("samples", []), float)).sum())
  needed = bootstrap.resamples_to_decide(family, FAMILY_ALPHA)
  if verdict != bootstrap.INCONCLUSIVE or row.verdict == bootstrap.INCONCLUSIVE or (
      replicates >= needed):
    return row.note
  why = (f"{replicates} bootstrap replicates cannot decide a family of {family} at "
         f"{FAMILY_ALPHA:.2f} (the smallest p is 2 / (Z + 1)): rerun the analysis with at "
         f"least {needed} (`bootstrap_resamples`)")
  return f"{row.note}; {why}" if row.note else why
