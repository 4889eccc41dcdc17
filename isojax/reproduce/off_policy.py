"""The off_policy section: configs/hard.py synchronous against off-policy generation.

Each setting of `rl.max_staleness` (PipelineRL-k, PPO-off-policy-k, in-flight updates)
runs once per seed: final `val/avg@4`, the gain, the staleness, what the update waited
for its rollouts, wall time, and ScaleRL's compute-performance sigmoid through the
seeds' mean, since off-policy generation is expected to move the efficiency (B, C_mid)
more than the asymptote A.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np
from absl import logging

from isojax import metrics, run_dir
from isojax.planner import sigmoid_fit
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables

# (name, flags) of the off_policy section's settings of configs/hard.py.
OFF_POLICY = (("synchronous", ()),
              *((f"pipeline, k = {k}", (f"--config.rl.max_staleness={k}",)) for k in (1, 2, 4, 8)),
              ("ppo_off_policy, k = 4", ("--config.rl.max_staleness=4",
                                          "--config.rl.off_policy=ppo_off_policy")),
              ("pipeline_in_flight, k = 4", ("--config.rl.max_staleness=4",
                                             "--config.rl.off_policy=pipeline_in_flight",
                                             "--config.rl.in_flight_tokens=2")))


def summarize(workdir: str) -> dict[str, Any]:
  """`runs.summarize_run` plus the mean staleness and the seconds a step waited for rollouts."""
  summary = runs_lib.summarize_run(workdir)
  steps = [r for r in run_dir.read_metrics(workdir)
           if r[run_dir.STEP] > 0 and metrics.TRAIN_REWARD in r]
  mean = lambda key: float(np.mean([r.get(key, 0.0) for r in steps]))
  waited = [r.get(metrics.TIME_ROLLOUT_WAIT, r.get("time/sample_s", 0.0) +
                  r.get("time/grade_wait_s", 0.0)) for r in steps]
  summary.update(staleness=mean("train/staleness_max"), rollout_wait_s=float(np.mean(waited)),
                 step_s=mean(metrics.TIME_STEP), update_s=mean("time/update_s"),
                 wall_curve=[(r[run_dir.WALL_S], r[metrics.val_avg(4)])
                             for r in run_dir.read_metrics(workdir) if metrics.val_avg(4) in r],
                 rollout_curve=[(r[run_dir.ROLLOUTS], r[metrics.val_avg(4)])
                                for r in run_dir.read_metrics(workdir)
                                if metrics.val_avg(4) in r])
  return summary


def fit_setting(rows: list[dict[str, Any]]) -> sigmoid_fit.SigmoidFit:
  """ScaleRL's sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) through the seeds'
  mean `val/avg@4` against the rollouts sampled (C), bounded to [0, 1]."""
  compute = [c for c, _ in rows[0]["rollout_curve"]]
  values = np.mean([[v for _, v in r["rollout_curve"]] for r in rows], axis=0)
  return sigmoid_fit.fit_sigmoid(compute, values, lower=0.0, upper=1.0)


def fits_table(runs: dict[str, list[dict[str, Any]]]) -> str:
  """Markdown: each setting's compute-performance sigmoid (A, B, C_mid)."""
  lines = ["| setting | R0 | A (asymptote) | B (efficiency) | C_mid (rollouts) | rmse |",
           "|---|---|---|---|---|---|"]
  for name, rows in runs.items():
    fit = fit_setting(rows)
    if fit.flat:
      lines.append(f"| {name} | {fit.r0:.3f} | no significant rise | | | {fit.rmse:.4f} |")
      continue
    lines.append(f"| {name} | {fit.r0:.3f} | {fit.a:.3f} +- {fit.a_stderr:.3f} | {fit.b:.2f} | "
                 f"{fit.c_mid:,.0f} | {fit.rmse:.4f} |")
  return "\n".join(lines)


def table(runs: dict[str, list[dict[str, Any]]]) -> str:
  """Markdown: a row per setting, its seeds side by side."""
  avg = metrics.val_avg(4)
  lines = ["| setting | final `val/avg@4` per seed | mean | gain / SE per seed | mean "
           "staleness | waited for rollouts per step | update per step | step | wall time "
           "per run |", "|---|---|---|---|---|---|---|---|---|"]
  for name, rows in runs.items():
    finals = [r["final"][avg] for r in rows]
    per_run = lambda key: tables.format_seconds(float(np.mean([r[key] for r in rows])))
    lines.append(
        f"| {name} | {', '.join(f'{v:.3f}' for v in finals)} | {np.mean(finals):.3f} | "
        f"{', '.join(runs_lib.gain_in_se(r) for r in rows)} | "
        f"{np.mean([r['staleness'] for r in rows]):.1f} | "
        f"{np.mean([r['rollout_wait_s'] for r in rows]):.3f} s | "
        f"{np.mean([r['update_s'] for r in rows]):.3f} s | "
        f"{np.mean([r['step_s'] for r in rows]):.3f} s | {per_run('wall_s')} |")
  return "\n".join(lines)


def plot(runs: dict[str, list[dict[str, Any]]], path: str) -> None:
  """Mean `val/avg@4` over seeds against the update step and the run's wall seconds."""
  fig, (by_step, by_time) = tables.figure((9, 3.4), nrows=1, ncols=2)
  for name, rows in runs.items():
    steps = [s for s, _ in rows[0]["curve"]]
    by_step.plot(steps, np.mean([[v for _, v in r["curve"]] for r in rows], axis=0),
                 marker=".", label=name)
    seconds = np.mean([[t for t, _ in r["wall_curve"]] for r in rows], axis=0)
    by_time.plot(seconds, np.mean([[v for _, v in r["wall_curve"]] for r in rows], axis=0),
                 marker=".", label=name)
  by_step.set(xlabel="update step", ylabel="val/avg@4 (mean over seeds)")
  by_time.set(xlabel="wall seconds of the run (steps and evaluations)")
  by_step.legend(fontsize=7)
  tables.save_figure(fig, path)


def run(inv: tables.Invocation, seeds: Sequence[str]) -> str:
  """off_policy.md and img/off_policy.png; returns the table's path."""
  wall_s, runs = 0.0, {}
  for index, (name, extra) in enumerate(OFF_POLICY):
    runs[name] = []
    for seed in seeds:
      workdir = os.path.join(inv.out, "off_policy", f"setting{index}_s{seed}")
      logging.info("off_policy %s, seed %s -> %s", name, seed, workdir)
      wall_s += runs_lib.run_main(inv, "configs/hard.py", workdir, seed, extra)
      runs[name].append(summarize(workdir))
  plot(runs, os.path.join(inv.results, "img", "off_policy.png"))
  body = "\n".join([
      "`configs/hard.py` (200 steps, n = 16, B_p = 16) from the shipped base model, "
      "synchronous and with off-policy generation (`rl.max_staleness` = k; `pipeline`: "
      "step s sampled by the policy of step s - k; `ppo_off_policy`: one policy samples "
      "k successive steps; `pipeline_in_flight`: free-running, the newest weights read "
      "every 2 tokens, batches older than k dropped; its runs depend on timing). "
      "Sampling runs on a host thread beside the update, on the "
      "same devices (here the CPU's cores). Waited for rollouts: the seconds a step "
      "spent before its batch was ready (synchronous: sampling and grading); step: its "
      "mean duration.", "", table(runs), "",
      "Compute-performance fits (ScaleRL's sigmoid, `isojax.planner.sigmoid_fit`) of the "
      "seeds' mean `val/avg@4` against the rollouts sampled (C = 0 to "
      f"{max(c for r in runs.values() for c, _ in r[0]['rollout_curve']):,}): ScaleRL "
      "found the off-policy setup to move the efficiency (B, C_mid) more than the "
      "asymptote A.",
      "", fits_table(runs), "",
      "![val/avg@4 against step and wall time](img/off_policy.png)", ""])
  return tables.write(inv, "off_policy.md", "Off-policy generation against the synchronous "
                      "loop", wall_s, body)
