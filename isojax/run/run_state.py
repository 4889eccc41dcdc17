"""What a run changes besides the policy, and what leaves the process.

`Workdir` is the run directory as opened, with its checkpoint manager, before anything
is restored. `RunState`, built whole once the checkpoint is restored, owns the counters,
No-Positive-Resampling's pool, the learner, the metric writers, the progress bar and the
rollout source: `record` writes a metrics line, `save` a checkpoint, `stop` ends the run
on a guard's event, `preempt` on a SIGTERM, and `close` releases all of it once, quietly
after an error.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
from absl import logging

from isojax import metrics, run_dir
from isojax.models import lora
from isojax.rl import guard, problem_pool
from isojax.rl import sources as sources_lib
from isojax.run import checkpointing, preemption


@dataclasses.dataclass
class Counters:
  """Cumulative compute and the guard's state, restored with the checkpoint."""
  step: int = 0
  rollouts: int = 0
  tokens: int = 0
  wall_s: float = 0.0
  collapse_streak: int = 0  # steps in a row with zero reward and gradient (rl/guard.py)
  kept_step: int = -1       # the checkpoint kept from before a collapse (-1: none)
  batches: int = 0          # rollout batches consumed: trained, or dropped as too stale


def counters_tree(counters: Counters, pool: problem_pool.ProblemPool | None) -> dict:
  """A checkpoint's JSON item: the counters and No-Positive-Resampling's pool (as
  lists; None without one). `restored_counters` is its inverse."""
  return dict(counters=dataclasses.asdict(counters), pool={
      k: v.tolist() for k, v in pool.to_dict().items()} if pool else None)


def restored_counters(tree: dict) -> tuple[Counters, problem_pool.ProblemPool | None]:
  """(counters, pool or None) from `counters_tree`'s item as a checkpoint restores it."""
  pool = tree.get("pool")
  return Counters(**tree["counters"]), (problem_pool.ProblemPool.from_dict(
      {k: np.asarray(v) for k, v in pool.items()}) if pool else None)


def kept_before_collapse(ckpt, counters: Counters) -> set[int]:
  """The checkpoints kept beside the newest `checkpoint_keep`: the newest one from before
  the collapse streak in progress (if any), and the one a confirmed collapse kept."""
  healthy = guard.healthy_step(counters.step, counters.collapse_streak)
  before = None if healthy is None else checkpointing.newest_at_or_before(ckpt, healthy)
  return {s for s in (before, counters.kept_step) if s is not None and s >= 0}


def resume_hint(kept_step: int | None, last: int | None, checkpoints: str) -> str:
  """Where a stopped run can go on from: the checkpoint kept from before a collapse
  (with the command that goes back to it), and the last one."""
  hint = (f"The last checkpoint, step {last} in {checkpoints}, is where a rerun resumes"
          if last is not None else "No checkpoint was saved yet: a rerun starts afresh")
  if kept_step is None or kept_step == last:
    return hint
  return (f"To go back to checkpoint step {kept_step} in {checkpoints}, from before the "
          f"collapse: rerun with --resume_step={kept_step} --allow_changed=optim.learning_rate "
          "--config.optim.learning_rate=<lower> (the same command otherwise). " + hint)


@dataclasses.dataclass(eq=False)
class Workdir:
  """A run's directory as opened, before anything is restored: its checkpoint manager,
  the steps kept beside the newest, and whether this process is the one writer.
  `close` waits for the last save and closes the manager, once."""
  path: str
  ckpt: Any                                    # orbax CheckpointManager
  kept: checkpointing.KeptSteps                # the healthy checkpoint before a collapse
  primary: bool                                # the one writer of a multi-host job
  _closed: bool = False

  def close(self, *exc) -> None:
    """After an error (`exc`, as an exit stack passes it), quietly: a failure here is
    logged, so it does not hide the first."""
    if self._closed:
      return
    self._closed = True
    _close_all([self.ckpt.wait_until_finished, self.ckpt.close], exc)


@dataclasses.dataclass(eq=False)
class RunState:
  """A run's state and outputs, built whole once its checkpoint is restored (or a
  fresh run's step 0 is set up); `close` closes all of it, once."""
  opened: Workdir
  counters: Counters
  pool: problem_pool.ProblemPool | None        # No-Positive-Resampling's (None: off)
  learner: Any                                 # rl.step.Learner
  writer: run_dir.MetricsWriter
  viewers: Any                                 # TensorBoard / W&B (metric_writers)
  source: sources_lib.RolloutSource
  bar: Any                                     # tqdm
  _closed: bool = False

  @property
  def workdir(self) -> str:
    return self.opened.path

  @property
  def ckpt(self):
    return self.opened.ckpt

  @property
  def kept(self) -> checkpointing.KeptSteps:
    return self.opened.kept

  @property
  def primary(self) -> bool:
    return self.opened.primary

  def record(self, values: dict) -> None:
    c = self.counters
    line = {run_dir.STEP: c.step, run_dir.ROLLOUTS: c.rollouts, run_dir.TOKENS: c.tokens,
            run_dir.WALL_S: round(c.wall_s, 3), **values}
    self.writer.write(line)
    if run_dir.EVENT not in line:  # events stay in metrics.jsonl
      self.viewers.write(line)  # TensorBoard / W&B: what metrics.jsonl holds

  def save(self) -> None:
    self.writer.flush()  # a resume from this checkpoint keeps the lines up to it
    learner, pool = self.learner, self.pool
    queue = self.source.checkpoint_tree()
    checkpointing.save(
        self.ckpt, self.counters.step,
        params=lora.trained_and_frozen(learner.params, enabled=learner.lora)[0],
        opt_state=learner.opt_state,
        counters=counters_tree(self.counters, pool),
        queue=queue, critic=learner.critic.checkpoint_tree() if learner.critic else None)

  def stop(self, event: dict) -> None:
    """Logs the guard's `event` and ends the run, naming the checkpoints to resume from."""
    self.record(event)
    last, before = self.ckpt.latest_step(), max(self.kept.steps, default=None)
    self.close()
    raise guard.RunStopped(f"{event['message']}. " + resume_hint(
        before, last, str(run_dir.checkpoint_dir(self.workdir))))

  def preempt(self) -> None:
    """Saves the step reached (if it is not saved yet), flushes and ends the run."""
    step, last = self.counters.step, self.ckpt.latest_step()
    if step > 0 and last != step:
      self.save()
      last = step
    where = (f"a rerun resumes at step {last} from {run_dir.checkpoint_dir(self.workdir)}"
             if last is not None else "nothing was saved yet: a rerun starts afresh")
    message = f"preempted after {step} steps (SIGTERM): {where}"
    lost = {}
    discarded = self.source.discarded_rollouts()
    if discarded is not None:  # in flight: its queue is not saved
      lost = {"discarded_rollouts": discarded}
      message += (f"; in flight, the {discarded} queued rollouts not yet trained and the "
                  "batch being generated are discarded (not counted)")
    if last is not None:
      self.record({run_dir.EVENT: metrics.EVENT_PREEMPTED, "message": message, **lost})
    self.close()
    raise preemption.Preempted(message)

  def close(self, *exc) -> None:
    """Closes the viewers, the checkpoints and the source, once. After an error
    (`exc`), quietly: no second error hides the first, no thread outlives the run."""
    if self._closed:
      return
    self._closed = True
    # Last: a failed write to an object store leaves the checkpoints and the source closed.
    _close_all([self.bar.close, self.viewers.close, functools.partial(self.opened.close, *exc),
                self.source.close, self.writer.flush], exc)


def _close_all(closers, exc) -> None:
  """Calls every closer. The first failure is raised once all have been called, or, after
  an error (`exc`), each is logged: no second error hides the first."""
  first = None
  for closer in closers:
    try:
      closer()
    except Exception as e:  # pylint: disable=broad-except
      if exc and exc[0]:
        logging.warning("while stopping: %s: %s", type(e).__name__, e)
      elif first is None:
        first = e
  if first is not None:
    raise first
