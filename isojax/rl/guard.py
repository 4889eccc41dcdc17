"""Stops a diverged run before it is checkpointed, and flags a collapsed one.

`train.run` calls these after every update and before it evaluates, logs or saves:

  * `non_finite`: a NaN or infinite loss, gradient norm or parameter ends the run at
    once, so the last checkpoint still holds finite parameters and is where a rerun
    (say with a lower `optim.learning_rate`) resumes.
  * `collapse`: zero training reward and a zero gradient norm for
    `guard.collapse_steps` consecutive steps mean the policy no longer learns anything
    (what a far too large learning rate leaves behind: every rollout fails, every
    advantage is zero). It warns once per streak, and stops the run when
    `guard.stop_on_collapse` is set.

While a streak runs, `healthy_step` names the newest step whose policy the guard has
not condemned, so the run can keep the checkpoint from before the collapse began.

Both return the fields of a `metrics.jsonl` event row (`event`, `message`, ...); the
caller adds step, rollouts, tokens and wall_s. They are pure functions of the step's
metrics, testable on synthetic sequences; the streak lives in the checkpointed counters
so a resumed run warns at the same step as an uninterrupted one.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from isojax import metrics, run_dir

# The scalar metrics that must stay finite, besides the parameters themselves.
WATCHED = (metrics.TRAIN_LOSS, metrics.TRAIN_GRAD_NORM)


class RunStopped(RuntimeError):
  """The guard stopped the run (its message says at which step and why)."""


@jax.jit
def all_finite(tree: Any) -> jax.Array:
  """[] bool: every float in `tree` (the parameters) is finite."""
  leaves = [jnp.isfinite(x).all() for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def non_finite(values: dict[str, float], *, params_finite: bool,
               step: int) -> dict[str, Any] | None:
  """The event for step `step` when its loss, gradient norm or parameters are not all
  finite, else None. `values` are the step's `train/...` metrics."""
  bad = [k for k in WATCHED if not math.isfinite(values[k])]
  bad += [] if params_finite else ["params"]
  if not bad:
    return None
  shown = ", ".join(f"{k}={values[k]}" if k in values else k for k in bad)
  return {run_dir.EVENT: metrics.EVENT_NON_FINITE, "quantities": bad,
          "message": f"step {step}: non-finite {shown}; the run stops before checkpointing it"}


def collapse(values: dict[str, float], *, streak: int, collapse_steps: int, stop: bool,
             step: int) -> tuple[int, dict[str, Any] | None]:
  """(streak, event): the collapsed steps in a row up to `step` (zero reward and zero
  gradient norm), and an event when the streak reaches `collapse_steps` (0 disables).

  `stop` (guard.stop_on_collapse) only changes the message; the caller stops.
  """
  collapsed = values[metrics.TRAIN_REWARD] == 0 and values[metrics.TRAIN_GRAD_NORM] == 0
  streak = streak + 1 if collapsed else 0
  if not collapse_steps or streak != collapse_steps:
    return streak, None
  then = ("the run stops (guard.stop_on_collapse)" if stop else
          "training continues; set guard.stop_on_collapse=True to stop")
  return streak, {run_dir.EVENT: metrics.EVENT_COLLAPSE, "steps": streak,
                  "message": f"step {step}: zero train/reward and zero train/grad_norm for "
                             f"{streak} consecutive steps (guard.collapse_steps): the policy "
                             f"has collapsed or learns nothing; {then}"}


def healthy_step(step: int, streak: int) -> int | None:
  """The newest step known healthy while a collapse streak of `streak` steps runs up to
  `step` (None when no streak runs). Step s's rollouts are sampled by the policy of step
  s - 1, so a streak that began at step b = step - streak + 1 condemns the policy of
  b - 1 already; b - 2 is the newest one before it."""
  return step - streak - 1 if streak > 0 else None
