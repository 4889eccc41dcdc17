"""The RL loop: sample n rollouts for each of B_p problems, verify, update; M times.

`run(settings, workdir)` is the whole job and is importable from a notebook (a
ConfigDict given there is resolved into the frozen `RunSettings` at its top, once; the
memory plan returns new settings with its passes filled in, and config.json is written
from them); `main.py` only parses flags. It reads top to bottom: the inputs checked
(`run_inputs.check_inputs`), the run directory and the run's state (`run_state.RunState`:
counters, checkpoints, writers; `save`, `stop`, `preempt`), the learner restored
(`_learner`), the rollout source (`rl/sources.py`: synchronous, dynamic sampling,
pipelined or in flight), then the loop: a batch from the source, one update
(`_train_on`), the guards, evaluation, logging and checkpoints. The problem order and
every random key are functions of (seed, step), so a run resumed from its checkpoint
continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import tqdm
from absl import logging
from flax import nnx

from isojax import host_memory, metric_writers, metrics, run_dir, storage
from isojax.config import config_lib, run_settings
from isojax.models import hf_checkpoint, lora, sharding
from isojax.rl import critic as critic_lib
from isojax.rl import guard, off_policy, optimizer, problem_pool, rollout_allocation, sources
from isojax.rl import settings as rl_settings
from isojax.rl import step as rl_step
from isojax.run import (checkpointing, evaluation, memory_plan, preemption, resume_check,
                        run_inputs, run_state, workdir_lock)
from isojax.tasks import splits

# On an object store metrics.jsonl is rewritten whole, so at most this often (and at
# each checkpoint and the end) rather than at every step.
METRICS_REWRITE_S = 30.0


def run(config: ml_collections.ConfigDict | run_settings.RunSettings, workdir: str, *,
        force_unlock: bool = False,
        allow_changed: Sequence[str] = (), resume_step: int | None = None
        ) -> dict[str, float]:
  """Trains; returns the last evaluation's metrics (without the per-problem counts).

  The workdir is locked for the run once the inputs are checked (`workdir_lock`: one
  writer; `force_unlock` takes over a stale lock). A SIGTERM stops the run at the next
  step boundary with that step saved and raises `preemption.Preempted`; rerunning
  resumes it exactly. A rerun resumes from the newest checkpoint, or from `resume_step`
  (the newer ones are moved aside), with the run's settings: the fields that
  `allow_changed` names may differ, and are recorded (`resume_check`).
  """
  s = config_lib.as_settings(config)
  with contextlib.ExitStack() as stack:
    notice = stack.enter_context(preemption.Notice())

    def hold_workdir() -> None:
      if jax.process_index() == 0:  # the one writer; the other processes share its workdir
        stack.enter_context(workdir_lock.hold(workdir, force=force_unlock))

    return _run(s, workdir, notice, hold_workdir, stack.push,
                allow_changed=tuple(allow_changed), from_step=resume_step)


@dataclasses.dataclass(frozen=True)
class _Restored:
  """What a run goes on from: its learner, counters and pool, restored from the newest
  checkpoint that restores, or fresh (`result` None)."""
  learner: rl_step.Learner
  counters: run_state.Counters
  pool: problem_pool.ProblemPool | None
  result: Any                    # checkpointing's restore result, or None
  schedule: Any                  # the learning-rate schedule


def _learner(s: run_settings.RunSettings, inputs: run_inputs.Inputs, opened: run_state.Workdir,
             *, from_step: int | None) -> _Restored:
  """The policy, its optimizer, reference and critic, with the counters and pool,
  restored from the newest checkpoint that restores (newer ones that do not are moved
  aside), or as a fresh run starts them."""
  mesh, workdir = inputs.mesh, opened.path
  policy = hf_checkpoint.load_model(inputs.path, mesh, **s.model.as_kwargs())
  graphdef, params = nnx.split(policy)
  # LoRA: only the adapters train, are held by the optimizer and are checkpointed; the
  # base weights stay as loaded and are the reference policy (its B matrices at zero).
  tx, schedule = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                          warmup_steps=s.warmup_steps,
                                          updates_per_step=s.rl.updates_per_step)
  arrays = rl_step.policy_arrays(params, tx, mesh, lora=s.model.lora.enabled,
                                 keeps_reference=s.rl.keeps_reference)
  base, opt_state, ref_params = arrays.frozen, arrays.opt_state, arrays.reference
  # No-Positive-Resampling's pool; per-problem allocation's pass history (threshold 0:
  # retiring nothing) when that runs without it.
  pool = (problem_pool.ProblemPool(len(inputs.train_problems), threshold=s.rl.retire_pass_rate)
          if s.rl.retire_pass_rate > 0 or s.rl.per_problem else None)
  counters = run_state.Counters()
  critic = (critic_lib.create(s.critic, s.rl, s.optim, s.model,
                              group_size=s.train_rollouts_per_problem,
                              warmup_steps=s.warmup_steps, mesh=mesh,
                              policy_graphdef=graphdef, policy_params=params)
            if s.rl.uses_critic else None)  # PPO's value model
  restored = checkpointing.restore_newest(
      opened.ckpt, params=arrays.trained, opt_state=opt_state,
      corrupt_dir=run_dir.corrupt_checkpoint_dir(workdir), primary=opened.primary,
      critic=critic.checkpoint_tree() if critic else None, step=from_step,
      superseded_dir=run_dir.superseded_checkpoint_dir(workdir))
  if restored is not None:
    opt_state = restored.opt_state
    params = lora.whole(restored.params, base)
    if critic is not None:
      critic.params, critic.opt_state = restored.critic["params"], restored.critic["opt_state"]
    counters, saved_pool = run_state.restored_counters(restored.counters)
    if pool is not None and saved_pool is not None:  # else a fresh one, as configured
      pool = saved_pool
    logging.info("resumed %s at step %d (%d rollouts)", workdir, counters.step,
                 counters.rollouts)
  learner = rl_step.Learner(
      s.rl, s.sampling, s.rollouts_per_problem, lora=s.model.lora.enabled, mesh=mesh,
      graphdef=graphdef, params=params, opt_state=opt_state, ref_params=ref_params, tx=tx,
      critic=critic, trained_rows=s.trained_batch_rollouts)
  return _Restored(learner, counters, pool, restored, schedule)


def _settings_event(workdir: str, inputs: run_inputs.Inputs, restored, *, start: int | None,
                    changed: dict, allow_changed: tuple[str, ...], primary: bool):
  """The `settings_changed` event a resume records (None: nothing to record). A
  damaged newest checkpoint set aside: the settings compared are the older step's."""
  if restored is None:
    return None
  if restored.step != start:
    changed = resume_check.check(workdir, inputs.requested, step=restored.step,
                                    allow=allow_changed)
  if primary and resume_check.needs_record(workdir, restored.step, changed,
                                              restored.superseded):
    return resume_check.record(workdir, restored.step, changed, restored.superseded)
  return None


def _start_events(state: run_state.RunState, restored, settings_event) -> None:
  """What a resume logs before its first step: checkpoints set aside, settings changed,
  an in-flight source restarted."""
  for failure in restored.corrupt if restored else ():
    state.record(failure.event())
  if settings_event:
    state.record(settings_event)
  if restored and isinstance(state.source, sources.InFlight):
    c = state.counters
    state.record({run_dir.EVENT: metrics.EVENT_IN_FLIGHT_RESTARTED, "first_batch": c.batches,
                  "message": f"resumed in flight at step {c.step}: sampling restarts at "
                             f"batch {c.batches} from the restored weights; batches sampled "
                             "after this checkpoint and not trained were discarded (not "
                             "counted)"})


def _train_on(state: run_state.RunState, batch: sources.Batch, s: run_settings.RunSettings,
              schedule, *,
              select_key, shuffle_key, step_start: float
              ) -> tuple[dict[str, Any], dict[str, float]]:
  """One update on `batch`; advances the counters. Returns the step's metrics and its
  timings."""
  learner, step = state.learner, state.counters.step
  # The sampler's freed buffers back to the kernel before the update allocates its own
  # (and, at the end of the step, the update's and a save's before the next sampling).
  host_memory.release_free_memory()
  update_start = time.time()
  result = learner.step(batch.scored, select_rng=jax.random.fold_in(select_key, step),
                        shuffle_rng=jax.random.fold_in(shuffle_key, step),
                        prefetched=batch.prefetched,
                        # the critic's warm-up: its steps leave the policy as it is
                        train_policy=(learner.critic is None
                                      or step >= s.critic.warmup_steps))
  timings = metrics.step_timings(batch.scored.timings, update_s=time.time() - update_start,
                                 step_s=time.time() - step_start,
                                 rollout_wait_s=batch.rollout_wait_s)
  c = state.counters
  c.step += 1
  c.batches += batch.batches
  c.rollouts += batch.generated_rollouts
  c.tokens += batch.scored.num_tokens
  c.wall_s += time.time() - step_start
  values = rl_step.step_metrics(
      s.rl, s.sampling, result, learning_rate=schedule(step * s.rl.updates_per_step),
      active_problems=batch.active_problems, has_reference=learner.ref_params is not None)
  values.update(batch.metrics)
  return values, timings


def _device_peak() -> dict[str, float]:
  """{metrics.MEMORY_DEVICE_PEAK: GiB} of the first local device's allocator since the
  process began; empty where the backend keeps no such count (XLA:CPU)."""
  peak = (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use")
  return {metrics.MEMORY_DEVICE_PEAK: peak / memory_plan.GIB} if peak else {}


def _collapse(state: run_state.RunState, values: dict,
              settings: rl_settings.GuardSettings) -> dict | None:
  """The guard's collapse event of this step (None: none), naming the checkpoint kept
  from before the collapse began."""
  c = state.counters
  c.collapse_streak, collapsed = guard.collapse(
      values, streak=c.collapse_streak, collapse_steps=settings.collapse_steps,
      stop=settings.stop_on_collapse, step=c.step)
  state.kept.steps = run_state.kept_before_collapse(state.ckpt, c)  # before a save rotates
  if collapsed and state.kept.steps:
    c.kept_step = max(state.kept.steps)
    collapsed = dict(collapsed, kept_step=c.kept_step, message=(
        f"{collapsed['message']}; checkpoint step {c.kept_step}, from before the "
        f"collapse began, is kept (--resume_step={c.kept_step} goes back to it)"))
  return collapsed


def _evaluate(state: run_state.RunState, inputs: run_inputs.Inputs, s: run_settings.RunSettings,
              key: jax.Array) -> dict[str, float | list[int]]:
  """The validation metrics of the learner's policy now (and the training set's pass@1
  histogram); the time counts in the run's wall time."""
  start_s = time.time()
  result = evaluation.evaluate(
      state.learner.graphdef, state.learner.params, inputs.tok, inputs.book,
      inputs.val_problems, inputs.verifier, s.eval, s.sampling, rng=key,
      histogram_problems=inputs.train_problems[:s.eval.train_problems])
  state.counters.wall_s += time.time() - start_s
  host_memory.release_free_memory()  # the evaluation's sampler buffers
  logging.info("step %d eval: %s", state.counters.step, " ".join(  # lists: jsonl only
      f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()
      if k not in metrics.PER_PROBLEM_COUNTS))
  return result


def _open_workdir(opened: run_state.Workdir, inputs: run_inputs.Inputs, *,
                  allow_changed: tuple[str, ...], from_step: int | None
                  ) -> tuple[int | None, dict]:
  """(the step a resume starts from or None, the settings changed since it): checks
  the settings and every metrics line before anything in the workdir changes, then
  writes config.json for a run that starts afresh."""
  workdir = opened.path
  # Nothing is written before the settings check: a workdir with a checkpoint holds a run.
  checkpointing.check_step(opened.ckpt, from_step)
  start = opened.ckpt.latest_step() if from_step is None else from_step
  changed = ({} if start is None else resume_check.check(
      workdir, inputs.requested, step=start, allow=allow_changed))
  if start is not None and opened.primary and run_dir.metrics_path(workdir).exists():
    # Every metrics line read before a checkpoint is moved aside or history appended:
    # a damaged line stops the resume with nothing changed.
    run_dir.read_metrics(workdir)
  if opened.primary and start is None:  # the run that creates the workdir (or starts afresh)
    run_dir.write_config(workdir, inputs.settings.to_dict())
  return start, changed


def _step_0(state: run_state.RunState, inputs: run_inputs.Inputs, run_eval: Callable[[], dict],
            notice: preemption.Notice) -> dict:
  """A fresh run's base model: evaluated, logged with the memory plan and what the task
  skipped, and saved (kept if a collapse begins at once). Returns the evaluation."""
  last_eval = run_eval()
  state.record(dict(
      last_eval, **{metrics.MEMORY_PLANNED: inputs.plan.peak / memory_plan.GIB},
      **{metrics.TASK_SKIPPED_PREFIX + k: v for k, v in inputs.skipped.items()},
      **{metrics.TASK_SKIPPED_ROWS_PREFIX + k: v for k, v in inputs.skipped_rows.items()}))
  if notice.reached(state.counters.step):  # during the evaluation: stop before step 1
    state.preempt()
  state.save()
  return last_eval


def _allocation_profile(s: run_settings.RunSettings, train_problems
                        ) -> rollout_allocation.Profile | None:
  """Per-problem allocation's priors: the split's profiled rates of the training problems
  (none for problems the task generates)."""
  if not s.rl.per_problem:
    return None
  rates, samples = ({}, 0) if not s.task.split else splits.training_pass_rates(
      s.task.splits_dir, s.task.split)
  return rollout_allocation.Profile.of([p.prompt for p in train_problems], rates, samples,
                                       s.rl.allocation_prior_mean,
                                       s.rl.allocation_prior_strength)


def _state(s: run_settings.RunSettings, inputs: run_inputs.Inputs, opened: run_state.Workdir,
           restored: _Restored, sample_key: jax.Array) -> run_state.RunState:
  """The run's whole state once restored: its metrics writers (the lines after the
  restored step dropped: the run goes on as if never interrupted), the rollout source
  (the restored queue of an in-flight run) and the progress bar."""
  resume_step = restored.result.step if restored.result else None
  writer = run_dir.MetricsWriter(opened.path, resume_step=resume_step, enabled=opened.primary,
                                 rewrite_every_s=METRICS_REWRITE_S)
  viewers = metric_writers.create(s.metric_writers, opened.path, resume_step=resume_step,
                                  enabled=opened.primary, run_config=s.to_dict())
  problems = sources.Problems(s.seed, s.rollouts_per_problem, s.problems_per_batch, s.rl,
                              s.sampling, restored.learner.graphdef, inputs.tok, inputs.book,
                              inputs.train_problems, inputs.verifier, restored.pool, sample_key,
                              _allocation_profile(s, inputs.train_problems))
  bar = tqdm.tqdm(total=s.num_steps, initial=restored.counters.step, desc="RL steps",
                  unit="step", dynamic_ncols=True, disable=None if opened.primary else True)
  try:  # last: an in-flight source starts sampling on a thread
    source = sources.make(
        problems, num_steps=s.num_steps, batches=restored.counters.batches,
        queue=restored.result and restored.result.queue,
        snapshot=off_policy.weight_snapshot(
            s.generator_weights_dtype,
            None if inputs.rollout_mesh is None
            else functools.partial(sharding.on_mesh, mesh=inputs.rollout_mesh)))
  except BaseException:
    bar.close()
    viewers.close()
    raise
  return run_state.RunState(opened, restored.counters, restored.pool, restored.learner,
                            writer, viewers, source, bar)


def _run(requested: run_settings.RunSettings, workdir: str, notice: preemption.Notice,
         hold_workdir: Callable[[], None], on_exit: Callable[[Callable], None], *,
         allow_changed: tuple[str, ...], from_step: int | None) -> dict[str, float]:
  storage.QuietLibraries.install()
  resume_check.check_allowance(allow_changed)  # a mistyped field fails before any work
  inputs = run_inputs.check_inputs(requested)  # fail fast, before any write
  s = inputs.settings  # as planned: the passes left at 0 are filled in
  num_steps = s.num_steps
  eval_at = s.eval.steps(num_steps)

  # ==================== Run directory and checkpoints ====================
  hold_workdir()  # before anything is read from or written to it
  kept = checkpointing.KeptSteps()  # the healthy checkpoint from before a collapse
  opened = run_state.Workdir(workdir, checkpointing.manager(
      run_dir.checkpoint_dir(workdir), keep=s.checkpoint_keep, kept=kept), kept,
      primary=jax.process_index() == 0)  # one writer per job, however many hosts
  on_exit(opened.close)
  start, changed = _open_workdir(opened, inputs, allow_changed=allow_changed,
                                 from_step=from_step)

  # ==================== Model, optimizer and restore ====================
  restored = _learner(s, inputs, opened, from_step=from_step)
  settings_event = _settings_event(workdir, inputs, restored.result, start=start,
                                   changed=changed, allow_changed=allow_changed,
                                   primary=opened.primary)
  kept.steps = run_state.kept_before_collapse(opened.ckpt, restored.counters)
  sample_key, eval_key, shuffle_key, select_key = jax.random.split(
      jax.random.key(s.seed), 4)
  state = _state(s, inputs, opened, restored, sample_key)
  on_exit(state.close)

  run_eval = functools.partial(_evaluate, state, inputs, s, eval_key)

  # ==================== Loop ====================
  c = state.counters
  resume_step = restored.result.step if restored.result else None
  _start_events(state, restored.result, settings_event)
  if notice.reached(c.step):  # during start-up: before the step-0 evaluation
    state.preempt()
  last_eval = _step_0(state, inputs, run_eval, notice) if restored.result is None else {}
  while c.step < num_steps:
    if c.step > (resume_step or 0) and notice.reached(c.step):
      state.preempt()
    step_start = time.time()
    batch = state.source.next_batch(c.step, state.learner)
    values, timings = _train_on(state, batch, s, restored.schedule, select_key=select_key,
                                shuffle_key=shuffle_key, step_start=step_start)
    diverged = guard.non_finite(values, step=c.step,
                                params_finite=bool(guard.all_finite(state.learner.params)))
    if diverged:
      state.stop(diverged)  # before anything of this step is evaluated, logged or saved
    collapsed = _collapse(state, values, s.guard)
    evaluate_now = c.step in eval_at
    values.update(timings, **_device_peak())
    if evaluate_now:
      eval_start = time.time()
      last_eval = run_eval()
      values.update(last_eval, **{metrics.TIME_EVAL: time.time() - eval_start})
    if evaluate_now or c.step % s.log_every == 0:
      state.record(values)
    if collapsed and s.guard.stop_on_collapse:
      state.stop(collapsed)
    elif collapsed:
      logging.warning(collapsed["message"])
      state.record(collapsed)
    if c.step % s.checkpoint_every == 0 or c.step == num_steps:
      state.save()
    host_memory.release_free_memory()
    state.bar.update(1)
    state.bar.set_postfix(
        reward=f"{values[metrics.TRAIN_REWARD]:.3f}",
        val=f"{last_eval.get(metrics.val_avg(s.eval.k), float('nan')):.3f}")
  state.close()
  final = last_eval or {k: v for k, v in run_dir.last_metrics(workdir).items()
                        if k.startswith(metrics.VAL_PREFIX)}
  # The summary metrics; the per-problem counts are in metrics.jsonl.
  return {k: v for k, v in final.items() if k not in metrics.PER_PROBLEM_COUNTS}
