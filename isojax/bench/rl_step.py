"""Where the time of an RL step goes: `train.run`'s own phase timings, averaged.

`train.run` logs every step's phases as `time/...` metrics (see `isojax.metrics`):
sampling on the devices, the host thread's decoding and grading (overlapping the
log-prob passes), what of them the main thread still waited for, the update, the rest
of the step, and evaluation. This runs a few steps of a config in a scratch workdir and
averages them, leaving out the first `warmup` steps (compilation).
"""

from __future__ import annotations

import tempfile

import ml_collections
import numpy as np

from isojax import metrics, run_dir
from isojax.configs import hard
from isojax.run import train

MAIN_THREAD = ("sample", "grade_wait", "update", "other")   # these add up to the step
HOST_THREAD = ("decode", "grade")                            # overlapped with the devices


def default_config(steps: int) -> ml_collections.ConfigDict:
  """The default preset (`configs/hard.py`), `steps` steps, evaluated after the last."""
  config = hard.get_config()
  config.num_steps = steps
  config.eval.every = steps
  config.checkpoint_every = steps
  config.metric_writers.tensorboard = False
  return config


def breakdown(config: ml_collections.ConfigDict, *, warmup: int = 1) -> dict:
  """Runs `config` in a scratch workdir and `summarize`s its step lines after `warmup`."""
  with tempfile.TemporaryDirectory(prefix="isojax_bench_step_") as workdir:
    train.run(config, workdir)
    lines = run_dir.read_metrics(workdir)
  return summarize(lines, warmup=warmup,
                   rollouts_per_step=config.problems_per_batch * config.rollouts_per_problem)


def summarize(lines: list[dict], *, warmup: int, rollouts_per_step: int) -> dict:
  """Mean seconds per phase over the step lines after `warmup`, their shares of a step,
  and the host's share: what the devices waited on the host for (grade_wait + other)."""
  lines = [r for r in lines if r[run_dir.STEP] > warmup]
  if not lines:
    raise ValueError(f"no step after warmup={warmup} to average")
  mean = lambda key: float(np.mean([r[key] for r in lines]))
  phases = {p: mean(f"{metrics.TIME_PREFIX}{p}_s") for p in MAIN_THREAD + HOST_THREAD}
  step_s = mean(metrics.TIME_STEP)
  evals = [r[metrics.TIME_EVAL] for r in lines if metrics.TIME_EVAL in r]
  return dict(steps=len(lines), step_s=step_s, seconds=phases,
              shares={p: phases[p] / step_s for p in MAIN_THREAD},
              host_share=(phases["grade_wait"] + phases["other"]) / step_s,
              eval_s=float(np.mean(evals)) if evals else None,
              rollouts_per_step=rollouts_per_step)


def format_breakdown(b: dict, title: str) -> list[str]:
  s = b["seconds"]
  lines = [f"RL step: {title}, mean of {b['steps']} steps after the first, "
           f"{b['rollouts_per_step']} rollouts each: {1000 * b['step_s']:.0f} ms per step"]
  lines += [f"  {p:<11}{1000 * s[p]:>8.1f} ms {100 * b['shares'][p]:>5.1f}%" for p in MAIN_THREAD]
  lines += [f"  host thread, overlapped: decode {1000 * s['decode']:.1f} ms, grade "
            f"{1000 * s['grade']:.1f} ms; host share of the step (grade_wait + other): "
            f"{100 * b['host_share']:.1f}%"]
  if b["eval_s"] is not None:
    lines.append(f"  evaluation (every eval.every steps, not in the step): {b['eval_s']:.2f} s")
  return lines
