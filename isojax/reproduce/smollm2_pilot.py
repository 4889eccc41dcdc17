"""The smollm2_pilot section: which candidate recipe of configs/pilot_smollm2.py stays stable
on SmolLM2-135M-Instruct, so that the seeded study runs with it.

The criterion, fixed before the runs: a candidate passes when on both of its seeds
  1. it learns: the final `val/avg@4` exceeds the step-0 one by at least 2 standard
     errors of the gain (paired over the validation problems, `runs.paired_gain`);
  2. no evaluation has more than 10% of its responses cut at the token cap;
  3. its length stays bounded: the mean training response length over the last 8
     steps is at most 1.5 times that of the first step.
The recipe is the largest learning rate that passes; none passing is reported as such.

Beside the verdict, the seed spread the study's size rests on (docs/study.md, "The seeded
study", step 5): the pooled seed-to-seed SD of the final `val/avg@4` over the
candidates, its 90% upper bound, and the slope per doubling of n that the study's
design decides with 80% power at each (`power.detectable_slope`).

Before the runs, the token cap's rule: `launch.profile` samples the base model at a
256-token cap (`LENGTH_PROFILE`), and the cap is the 99th percentile of every sample's
length, rounded up to a multiple of 32; the section stops, naming both, when
configs/pilot_smollm2.py's `MAX_NEW_TOKENS` is not that.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np
from scipy import stats

from isojax import metrics, run_dir, storage
from isojax.configs import pilot_smollm2, sweep_smollm2_hard
from isojax.planner import power
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.tasks import splits

CONFIG = "configs/pilot_smollm2.py"
SEEDS = ("0", "1")
MIN_GAIN_SE = 2.0       # 1: the gain in paired standard errors
MAX_CUT = 0.10          # 2: responses cut at the cap, at any evaluation
MAX_LENGTH_GROWTH = 1.5  # 3: late training responses over the first step's
LATE_STEPS = 8
# The base model's lengths at a generous cap (continuous batching: the long tail of a
# few rambling samples does not hold up the rest), on 64 training and 32 validation
# problems, 16 samples each.
LENGTH_PROFILE = ("--config=configs/smollm2.py", "--config.sampling.max_new_tokens=256",
                  "--config.sampling.decode_slots=64", "--config.task.num_val=64",
                  "--pool_size=64",
                  "--val_pool_size=32", "--num_samples=16", "--num_train=8", "--num_val=4",
                  "--splits=easy,hard")
CAP_PERCENTILE, CAP_MULTIPLE = 99.0, 32
# The study's primary family: claim 1 on each split, 2a on the hard one, 2b on the easy.
STUDY_FAMILY = 4
STUDY_EFFECTS = (0.01, 0.02, 0.03)  # slopes per doubling of n the spread note sizes


def cap_rule(lengths) -> int:
  """The cap that leaves the base's answers whole: the 99th percentile of its lengths,
  rounded up to a multiple of 32."""
  return CAP_MULTIPLE * math.ceil(float(np.percentile(lengths, CAP_PERCENTILE))
                                  / CAP_MULTIPLE)


def length_profile(inv: tables.Invocation) -> tuple[str, int, float]:
  """`launch.profile` at the 256-token cap (reused when done): its pool table, the
  cap the rule gives, and the seconds it took."""
  out = os.path.join(inv.out, "smollm2_pilot", "length_profile")
  start = time.time()
  subprocess.run([sys.executable, "-m", "launch.profile", f"--out={out}", *LENGTH_PROFILE],
                 cwd=inv.repo, check=True, stdout=subprocess.DEVNULL)
  rows = storage.read_json(os.path.join(out, splits.PROFILE_FILE))
  lengths = np.concatenate([r["lengths"] for r in rows["train"] + rows["val"]])
  return splits.pool_table(out), cap_rule(lengths), time.time() - start


def criteria(summary: dict[str, Any], lines: list[dict]) -> dict[str, Any]:
  """One run's three measures and whether each passes."""
  cut = max(r[metrics.VAL_TRUNCATED] for r in lines if metrics.VAL_TRUNCATED in r)
  lengths = [r[metrics.TRAIN_RESPONSE_LENGTH] for r in lines
             if metrics.TRAIN_RESPONSE_LENGTH in r]
  growth = float(np.mean(lengths[-LATE_STEPS:]) / lengths[0])
  gain_se = summary["gain"] / summary["gain_se"] if summary["gain_se"] else 0.0
  return dict(gain_se=gain_se, cut=cut, growth=growth,
              passes=gain_se >= MIN_GAIN_SE and cut <= MAX_CUT and growth <= MAX_LENGTH_GROWTH)


def chosen(results: dict[str, list[dict[str, Any]]], rates: dict[str, float]) -> str | None:
  """The largest learning rate whose runs all pass (None: none does)."""
  passing = [name for name, runs in results.items() if all(r["passes"] for r in runs)]
  return max(passing, key=rates.__getitem__) if passing else None


def seed_spread(finals: dict[str, list[float]]) -> tuple[float, float, int]:
  """The pooled seed-to-seed SD of a final value over the candidates (each its own mean),
  its one-sided 90% upper bound (chi-square) and its degrees of freedom."""
  groups = [np.asarray(v, np.float64) for v in finals.values() if len(v) > 1]
  dof = sum(g.size - 1 for g in groups)
  if not dof:
    raise ValueError("the seed spread needs a candidate with two or more seeds")
  sd = math.sqrt(sum(((g - g.mean()) ** 2).sum() for g in groups) / dof)
  return sd, sd * math.sqrt(dof / stats.chi2.ppf(0.10, dof)), dof


def spread_note(finals: dict[str, list[float]]) -> str:
  """What the pilot's seed spread says of the study's size."""
  sd, sd_hi, dof = seed_spread(finals)
  head = (f"**The seed spread and the study's size.** The final `val/avg@4`'s seed-to-seed "
          f"SD (each run's last evaluation), pooled over the candidates: {sd:.3f} ({dof} "
          "degrees of freedom, fewer in effect: each candidate ran the same seeds")
  if sd == 0.0:
    return head + "). With no spread measured it says nothing of the study's size."
  return (head + f"; 90% upper bound {sd_hi:.3f}). " + design_power(sd, sd_hi) +
          " A guide to the study's size, not its power: the "
          "study's final is also a run's last evaluation, but its claims 2a and 2b are "
          "slopes of best@4 and worst@4 and claim 1 a trend of n*, and the pilot "
          "evaluates 64 problems where the study evaluates 128.")


def design_power(sd: float, sd_hi: float) -> str:
  """The slope per doubling of n the study's design decides with 80% power at a seed
  SD `sd` of a final value (and at its upper bound `sd_hi`), and the seeds each effect
  of `STUDY_EFFECTS` would need (`isojax.planner.power`)."""
  design = sweep_smollm2_hard.get_config()
  lo, hi = design.rollouts_range
  log2_ns = range(int(math.log2(lo)), int(math.log2(hi)) + 1)
  seeds = len(design.seeds)
  detect = {s: power.detectable_slope(s, log2_ns, seeds, family=STUDY_FAMILY)
            for s in (sd, sd_hi)}
  needed = ", ".join(
      f"{e:g}: {power.seeds_for_slope(sd, e, log2_ns, family=STUDY_FAMILY) or '>1000'}"
      for e in STUDY_EFFECTS)
  return (f"The study (n in {{{', '.join(str(2 ** x) for x in log2_ns)}}}, {seeds} seeds "
          f"each, Holm over its {STUDY_FAMILY} primary rows at 0.10) then decides a slope "
          f"of {detect[sd]:.3f} per doubling of n with 80% power ({detect[sd_hi]:.3f} at "
          f"the bound); seeds per allocation for 80% power at a slope of {needed} "
          "(`isojax.planner.power`).")


def run(inv: tables.Invocation, preset: str = "") -> str:
  """smollm2_pilot.md; returns its path."""
  table, cap, wall_s = length_profile(inv)
  if cap != pilot_smollm2.MAX_NEW_TOKENS:
    raise ValueError(f"the length profile's rule gives a {cap}-token cap; "
                     f"configs/pilot_smollm2.py has MAX_NEW_TOKENS="
                     f"{pilot_smollm2.MAX_NEW_TOKENS}: set it to {cap}")
  results, finals, rows = {}, {}, []
  for name in pilot_smollm2.LEARNING_RATES:
    results[name], finals[name] = [], []
    for seed in SEEDS:
      workdir = os.path.join(inv.out, "smollm2_pilot", f"{name}_s{seed}")
      config = f"{CONFIG}:{preset + ',' if preset else ''}{name}"
      wall_s += runs_lib.run_main(inv, config, workdir, seed)
      summary = runs_lib.summarize_run(workdir)
      measured = criteria(summary, run_dir.read_metrics(workdir))
      results[name].append(measured)
      finals[name].append(summary["final"][metrics.val_avg(4)])
      rows.append(_row(name, seed, summary, measured))
  pick = chosen(results, pilot_smollm2.LEARNING_RATES)
  verdict = (f"**{pick}** (optim.learning_rate = {pilot_smollm2.LEARNING_RATES[pick]:g}) "
             "passes on both seeds and is the study's recipe." if pick else
             "**No candidate passes on both seeds**: the next candidates add a KL term to "
             "the base (`rl.kl_coef`).")
  body = "\n".join([
      "The base model's lengths (`launch.profile` at a 256-token cap, "
      f"{' '.join(LENGTH_PROFILE)}): per difficulty, tokens at the median, 90th "
      "percentile and longest, and the fraction cut at 256. The cap is the 99th "
      f"percentile of every sample's length rounded up to a multiple of 32: {cap}.", "",
      "```", table, "```", "",
      f"`{CONFIG}`: SmolLM2-135M-Instruct on chain_sum, truncation scored 0, a warm-up of "
      f"640 rollouts, responses up to {pilot_smollm2.MAX_NEW_TOKENS} tokens, B_p = 8 x "
      "n = 8 for the config's steps, one learning rate per candidate, seeds "
      f"{', '.join(SEEDS)}. A candidate passes when on both seeds the gain is at least "
      f"{MIN_GAIN_SE:g} paired standard errors, no evaluation cuts more than "
      f"{MAX_CUT:.0%} of its responses, and the last {LATE_STEPS} steps' mean response "
      f"length is at most {MAX_LENGTH_GROWTH:g}x the first step's (fixed before the runs).",
      "", "| candidate | seed | step-0 `val/avg@4` | final | gain / SE | most cut at an "
      "evaluation | length growth | passes |", "|---|---|---|---|---|---|---|---|",
      *rows, "", verdict, "", spread_note(finals), ""])
  return tables.write(inv, "smollm2_pilot.md", "The SmolLM2 recipe pilot", wall_s, body)


def _row(name: str, seed: str, summary: dict[str, Any], m: dict[str, Any]) -> str:
  avg = metrics.val_avg(4)
  return (f"| {name} | {seed} | {summary['initial'][avg]:.3f} | {summary['final'][avg]:.3f} | "
          f"{m['gain_se']:.1f} | {m['cut']:.2f} | {m['growth']:.2f} | "
          f"{'yes' if m['passes'] else 'no'} |")

