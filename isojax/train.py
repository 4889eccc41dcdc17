"""The RL loop: sample n rollouts for each of B_p problems, verify, update; M times.

`run(config, workdir)` is the whole job and is importable from a notebook; `main.py`
only parses flags. It reads top to bottom: run directory, mesh, task, model, optimizer,
checkpoint, loop. The problem order and every random key are functions of
(seed, step), so a run resumed from its checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging as std_logging
import threading
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm
from absl import logging
from flax import nnx

from isojax import (checkpointing, config_lib, eval_settings, evaluation, host_memory,
                    memory_plan, metric_writers, metrics, preemption, resume_settings, run_dir,
                    storage, tasks, workdir_lock)
from isojax.models import hf_checkpoint, lora, sharding
from isojax.models import tokenizer as tokenizer_lib
from isojax.rl import (advantages, dynamic_sampling, guard, off_policy, problem_pool, rollout,
                       update)
from isojax.rl import batch as rl_batch
from isojax.rl import critic as critic_lib
from isojax.rl import names
from isojax.rl import step as rl_step
from isojax.tasks import demo_bases, prompts

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


def problems_for_step(seed: int, step: int, num_problems: int, batch: int) -> np.ndarray:
  """Indices of the B_p problems of update `step`: epoch-wise shuffles, stateless."""
  out = []
  position = step * batch
  while len(out) < batch:
    epoch, offset = divmod(position, num_problems)
    order = np.random.default_rng([seed, epoch]).permutation(num_problems)
    take = order[offset:offset + batch - len(out)]
    out.extend(take.tolist())
    position += len(take)
  return np.asarray(out)


def policy_path(config: ml_collections.ConfigDict) -> str:
  """`base_model.path`, or the shipped demo base model of the task (`demo_bases`)."""
  return demo_bases.policy_path(config)


def load_task(config: ml_collections.ConfigDict, tok: tokenizer_lib.TextTokenizer
              ) -> tuple[list[tasks.Problem], list[tasks.Problem], prompts.PromptBook,
                         dict[str, int], dict[str, list[str]]]:
  """Train / validation problems with their rendered prompts; what was skipped, by
  reason, and the first few skipped rows of each reason the loader names.

  Fails (before anything is written or compiled) when too few problems remain.
  """
  data = tasks.load(config.task)
  book, kept, dropped = prompts.build({"train": data.train, "val": data.val}, tok,
                                      config.task, tasks.default_instruction(config.task))
  skipped = dict(data.skipped)
  long_prompts = dropped["train"] + dropped["val"]
  if long_prompts:
    skipped["prompt_over_max_prompt_tokens"] = long_prompts
  train_problems, val_problems = kept["train"], kept["val"]
  logging.info("task %s: %d training and %d validation problems; prompts up to %d tokens%s",
               config.task.name, len(train_problems), len(val_problems), book.max_len,
               f"; skipped {skipped}" if skipped else "")
  b_p = config.problems_per_batch
  if b_p > len(train_problems):
    raise ValueError(f"problems_per_batch={b_p} exceeds the {len(train_problems)} training "
                     f"problems of task {config.task.name!r}"
                     f"{f' (split {config.task.split!r})' if config.task.split else ''}"
                     f"{f'; skipped {skipped}' if skipped else ''}")
  if not val_problems:
    raise ValueError(f"task {config.task.name!r} has no validation problems"
                     f"{f' (skipped {skipped})' if skipped else ''}")
  return train_problems, val_problems, book, skipped, data.skipped_rows


def plan_passes(config: ml_collections.ConfigDict, path: str, prompt_len: int
                ) -> memory_plan.Plan:
  """Checks prompt + max_new_tokens against the model's context and sets the passes
  left at 0 (micro-batch, LM-head chunk, sampler call) in `config` from the model's
  shape and the memory there is (`memory_plan`); logs the plan. Raises, naming the
  fields, when the run cannot fit."""
  hf = hf_checkpoint.read_hf_config(path)
  source = hf_checkpoint.config_source(path)
  memory_plan.check_context(prompt_len=prompt_len,
                            max_new_tokens=config.sampling.max_new_tokens,
                            context=hf.get("max_position_embeddings"), source=source)
  model_cfg = hf_checkpoint.model_config_from_hf(hf, **config.model, source=source)
  plan = memory_plan.for_config(config, model_cfg, prompt_len=prompt_len)
  config.rl.micro_batch_size = plan.passes.micro_batch_size
  config.rl.logprob_chunk_size = plan.passes.logprob_chunk_size
  config.sampling.max_rollouts_per_call = plan.passes.max_rollouts_per_call
  logging.info("memory: %s", plan.describe())
  return plan


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


class _DropLibraryInfo(std_logging.Filter):
  """Orbax logs every save step at INFO through absl; keep its warnings only. A full disk
  the libraries log too, with a traceback, from each of orbax's writer threads and each
  asyncio task left with the error: the save raises `storage.NoSpace`, whose one line
  says it all."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if "/isojax/" not in record.pathname and record.levelno >= std_logging.WARNING:
      error = record.exc_info[1] if record.exc_info else None
      return not (storage.is_no_space(error)
                  or storage.is_no_space(Exception(record.getMessage())))
    return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname


def run(config: ml_collections.ConfigDict, workdir: str, *, force_unlock: bool = False,
        allow_changed: Sequence[str] = (), resume_step: int | None = None
        ) -> dict[str, float]:
  """Trains; returns the last evaluation's metrics (without the per-problem counts).

  The workdir is locked for the run once the inputs are checked (`workdir_lock`: one
  writer; `force_unlock` takes over a stale lock). A SIGTERM stops the run at the next
  step boundary with that step saved and raises `preemption.Preempted`; rerunning
  resumes it exactly. A rerun resumes from the newest checkpoint, or from `resume_step`
  (the newer ones are moved aside), with the run's settings: the fields that
  `allow_changed` names may differ, and are recorded (`resume_settings`).
  """
  config = config_lib.resolve(config)
  with contextlib.ExitStack() as stack:
    notice = stack.enter_context(preemption.Notice())

    def hold_workdir() -> None:
      if jax.process_index() == 0:  # the one writer; the other processes share its workdir
        stack.enter_context(workdir_lock.hold(workdir, force=force_unlock))

    return _run(config, workdir, notice, hold_workdir, stack.push,
                allow_changed=tuple(allow_changed), from_step=resume_step)


def _run(config: ml_collections.ConfigDict, workdir: str, notice: preemption.Notice,
         hold_workdir: Callable[[], None], on_exit: Callable[[Callable], None], *,
         allow_changed: tuple[str, ...], from_step: int | None) -> dict[str, float]:
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropLibraryInfo) for f in handler.filters):
    handler.addFilter(_DropLibraryInfo())
  resume_settings.check_allowance(allow_changed)  # a mistyped field fails before any work
  n, b_p, num_steps = config.rollouts_per_problem, config.problems_per_batch, config.num_steps
  eval_at = eval_settings.EvalSettings.from_config(config.eval).steps(num_steps)  # a function of config: resumes agree
  # ==================== Mesh, tokenizer and task (fail fast, before any write) ====
  mesh, rollout_mesh = sharding.make_meshes(config.mesh)  # rollout_mesh: None (colocated)
  path = policy_path(config)
  hf_checkpoint.check_files(path, **config.model)  # headers and sizes; reads no weights
  tok = tokenizer_lib.load_tokenizer(path, extra_stop_ids=tuple(config.sampling.stop_token_ids))
  rollout.interruption(config.sampling, tok)  # its text must fit the tokenizer: fail fast
  critic_lib.check_vocabulary(config, path)   # a loaded critic reads the policy's tokens
  train_problems, val_problems, book, skipped, skipped_rows = load_task(config, tok)
  requested = resume_settings.settings(config)  # as set: before the plan fills in passes
  plan_passes(config, path, book.max_len)  # the context and memory: fail fast
  verifier = tasks.make_verifier(config.task)

  # ==================== Run directory and checkpoints ====================
  hold_workdir()  # before anything is read from or written to it
  kept = checkpointing.KeptSteps()  # the healthy checkpoint from before a collapse
  ckpt = checkpointing.manager(run_dir.checkpoint_dir(workdir), keep=config.checkpoint_keep,
                               kept=kept)
  bar = viewers = generator = None  # the progress bar, metric viewers, off-policy sampler
  closed = []

  def close(*exc) -> None:
    """Closes the viewers, the checkpoints and the generator, once. After an error
    (`exc`), quietly: no second error hides the first, no thread outlives the run."""
    if closed:
      return
    closed.append(True)
    closers = [x.close for x in (bar, viewers) if x is not None]
    closers += [ckpt.wait_until_finished, ckpt.close]
    closers += [generator.close] if generator is not None else []
    for closer in closers:
      try:
        closer()
      except Exception as e:  # pylint: disable=broad-except
        if not (exc and exc[0]):
          raise
        logging.warning("while stopping: %s: %s", type(e).__name__, e)

  on_exit(close)
  # Nothing is written before the settings check: a workdir with a checkpoint holds a run.
  checkpointing.check_step(ckpt, from_step)
  start = ckpt.latest_step() if from_step is None else from_step
  changed = ({} if start is None else
             resume_settings.check(workdir, requested, step=start, allow=allow_changed))
  primary = jax.process_index() == 0  # one writer per job, however many hosts
  if primary and start is None:  # the run that creates the workdir (or starts it afresh)
    run_dir.write_config(workdir, config.to_dict())

  # ==================== Model ====================
  policy = hf_checkpoint.load_model(path, mesh, **config.model)
  graphdef, params = nnx.split(policy)
  # LoRA: only the adapters train, are held by the optimizer and are checkpointed; the
  # base weights stay as loaded and are the reference policy (its B matrices at zero).
  use_lora = config.model.lora.rank > 0
  trained, base = lora.split(params) if use_lora else (params, None)
  keep_reference = config.rl.kl_coef > 0 or config.rl.log_kl_to_base
  ref_params = None
  if keep_reference:
    ref_params = lora.disabled(params) if use_lora else jax.tree.map(jnp.copy, params)
  pool = (problem_pool.ProblemPool(len(train_problems), threshold=config.rl.retire_pass_rate)
          if config.rl.retire_pass_rate > 0 else None)

  # ==================== Optimizer and restore ====================
  tx, schedule = update.make_optimizer(config)
  opt_state = jax.jit(tx.init, out_shardings=update.opt_state_shardings(tx, trained, mesh))(
      trained)
  critic = (critic_lib.create(config, mesh, graphdef, params)
            if config.rl.advantage == names.GAE else None)  # PPO's value model
  counters = Counters()
  # The newest checkpoint that restores; newer ones that do not are moved aside.
  restored = checkpointing.restore_newest(
      ckpt, params=trained, opt_state=opt_state,
      corrupt_dir=run_dir.corrupt_checkpoint_dir(workdir), primary=primary,
      critic=critic.checkpoint_tree() if critic else None, step=from_step,
      superseded_dir=run_dir.superseded_checkpoint_dir(workdir))
  resume_step = restored.step if restored else None
  if restored is not None and restored.step != start:  # a damaged newest one set aside:
    changed = resume_settings.check(  # the settings to compare are those of the older step
        workdir, requested, step=restored.step, allow=allow_changed)
  settings_event = None  # a resume that changed settings (allowed) or went back
  if restored is not None and primary and resume_settings.needs_record(
      workdir, restored.step, changed, restored.superseded):
    settings_event = resume_settings.record(workdir, restored.step, changed,
                                            restored.superseded)
  if restored is not None:
    opt_state = restored.opt_state
    params = lora.merge(restored.params, base) if use_lora else restored.params
    if critic is not None:
      critic.params, critic.opt_state = restored.critic["params"], restored.critic["opt_state"]
    counters = Counters(**restored.counters["counters"])
    if pool is not None:
      pool = problem_pool.ProblemPool.from_dict(
          {k: np.asarray(v) for k, v in restored.counters["pool"].items()})
    logging.info("resumed %s at step %d (%d rollouts)", workdir, counters.step,
                 counters.rollouts)
  kept.steps = kept_before_collapse(ckpt, counters)
  # Lines after the restored step are dropped: the run ends as if never interrupted.
  writer = run_dir.MetricsWriter(workdir, resume_step=resume_step, enabled=primary)
  viewers = metric_writers.create(config.metric_writers, workdir, resume_step=resume_step,
                                  enabled=primary, run_config=config.to_dict())
  learner = rl_step.Learner(config, mesh, graphdef, params, opt_state, ref_params, tx, critic)
  del params, opt_state, trained  # the learner owns (and donates) them from here on

  rng = jax.random.key(config.seed)
  sample_key, eval_key, shuffle_key, select_key = jax.random.split(rng, 4)

  def record(values: dict) -> None:
    line = {run_dir.STEP: counters.step, run_dir.ROLLOUTS: counters.rollouts,
            run_dir.TOKENS: counters.tokens, run_dir.WALL_S: round(counters.wall_s, 3),
            **values}
    writer.write(line)
    if run_dir.EVENT not in line:  # events stay in metrics.jsonl
      viewers.write(line)  # TensorBoard / W&B: what metrics.jsonl holds

  def run_eval() -> dict[str, float | list[int]]:
    start = time.time()
    result = evaluation.evaluate(
        graphdef, learner.params, tok, book, val_problems, verifier, config, rng=eval_key,
        histogram_problems=train_problems[:config.eval.train_problems])
    counters.wall_s += time.time() - start
    host_memory.release_free_memory()  # the evaluation's sampler buffers
    logging.info("step %d eval: %s", counters.step, " ".join(  # per-problem lists: jsonl only
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()
        if k not in metrics.PER_PROBLEM_COUNTS))
    return result

  def choose(step: int) -> np.ndarray:
    """The B_p training-problem ids of update `step`."""
    if pool is None:
      return problems_for_step(config.seed, step, len(train_problems), b_p)
    return pool.sample(np.random.default_rng([config.seed, step]), b_p)

  def active_problems() -> int:
    return len(train_problems) if pool is None else int(pool.active_ids().size)

  def draw(step: int, params, round_index: int) -> tuple[np.ndarray, rollout.ScoredRollouts]:
    """Round `round_index` of the problems of `step`, sampled by `params` and graded."""
    step_key = jax.random.fold_in(sample_key, step)
    if round_index == 0:
      chosen, key = choose(step), step_key
    else:  # dynamic sampling's further rounds
      key = jax.random.fold_in(step_key, round_index)
      chosen = (dynamic_sampling.extra_problems(config.seed, step, round_index,
                                                len(train_problems), b_p) if pool is None
                else pool.sample(np.random.default_rng([config.seed, step, round_index]), b_p))
    scored = rollout.generate(graphdef, params, tok, book, [train_problems[i] for i in chosen],
                              verifier, n=n, rng=key, sampling=config.sampling)
    if pool is not None:
      pool.update(np.repeat(chosen, n), scored.rewards_GN.reshape(-1))
    return chosen, scored

  def collect(step: int, params) -> dynamic_sampling.Collected:
    """The groups `step` trains on: one round, or rounds until B_p carry a signal."""
    if not config.rl.dynamic_sampling:
      chosen, scored = draw(step, params, 0)
      return dynamic_sampling.Collected(chosen, scored, scored.rewards_GN.size, rounds=1)
    return dynamic_sampling.collect(
        functools.partial(draw, step, params), problems_per_batch=b_p,
        max_rounds=config.rl.dynamic_sampling_max_rounds,
        informative=lambda scored: ~advantages.zero_variance_groups(
            rl_batch.training_rewards(config, scored)))

  def sample_step(step: int, version: int, params) -> off_policy.Generated:
    """Off-policy runs: the batch of `step`, sampled by `params` (policy `version`)."""
    collected = collect(step, params)
    return off_policy.Generated(step, version, collected.chosen, collected.scored,
                                active_problems(), generated=collected.generated_rollouts,
                                rounds=collected.rounds)

  snapshot = (None if rollout_mesh is None
              else functools.partial(sharding.on_mesh, mesh=rollout_mesh))
  if config.rl.max_staleness and config.rl.off_policy == "pipeline_in_flight":
    pool_lock = threading.Lock()  # the generator chooses while the learner records

    def sample_batch(index: int, in_flight: rollout.InFlight) -> off_policy.Generated:
      with pool_lock:
        chosen, active = choose(index), active_problems()
      scored = rollout.generate(graphdef, None, tok, book, [train_problems[i] for i in chosen],
                                verifier, n=n, rng=jax.random.fold_in(sample_key, index),
                                sampling=config.sampling, in_flight=in_flight)
      return off_policy.Generated(index, int(scored.versions_B2[:, 0].min()), chosen, scored,
                                  active)

    def consumed(generated: off_policy.Generated) -> None:
      counters.batches += 1
      if pool is not None:
        with pool_lock:
          pool.update(np.repeat(generated.chosen, n), generated.scored.rewards_GN.reshape(-1))

    generator = off_policy.InFlightGenerator(
        sample_batch, max_staleness=config.rl.max_staleness, first_batch=counters.batches,
        in_flight_tokens=config.rl.in_flight_tokens, consumed=consumed, snapshot=snapshot)
  elif config.rl.max_staleness:
    generator = off_policy.Generator(
        sample_step, max_staleness=config.rl.max_staleness, mode=config.rl.off_policy,
        num_steps=num_steps, queued=off_policy.restore_queue(restored and restored.queue),
        snapshot=snapshot)

  def save() -> None:
    # The queued batches first: waiting for them leaves the pool as they left it.
    queue = off_policy.queue_tree(generator.queued()) if generator else None
    checkpointing.save(ckpt, counters.step,
                       params=lora.split(learner.params)[0] if use_lora else learner.params,
                       opt_state=learner.opt_state,
                       counters=dict(counters=dataclasses.asdict(counters), pool={
                           k: v.tolist() for k, v in pool.to_dict().items()} if pool else None),
                       queue=queue,
                       critic=learner.critic.checkpoint_tree() if learner.critic else None)

  def stop(event: dict) -> None:
    """Logs the guard's `event` and ends the run, naming the checkpoints to resume from."""
    record(event)
    last, before = ckpt.latest_step(), max(kept.steps, default=None)
    close()
    raise guard.RunStopped(f"{event['message']}. " + resume_hint(
        before, last, str(run_dir.checkpoint_dir(workdir))))

  def preempt() -> None:
    """Saves the step reached (if it is not saved yet), flushes and ends the run."""
    step, last = counters.step, ckpt.latest_step()
    if step > 0 and last != step:
      save()
      last = step
    where = (f"a rerun resumes at step {last} from {run_dir.checkpoint_dir(workdir)}"
             if last is not None else "nothing was saved yet: a rerun starts afresh")
    message = f"preempted after {step} steps (SIGTERM): {where}"
    lost = {}
    if isinstance(generator, off_policy.InFlightGenerator):  # its queue is not saved
      lost = {"discarded_rollouts": generator.unconsumed_rollouts()}
      message += (f"; in flight, the {lost['discarded_rollouts']} queued rollouts not yet "
                  "trained and the batch being generated are discarded (not counted)")
    if last is not None:
      record({run_dir.EVENT: metrics.EVENT_PREEMPTED, "message": message, **lost})
    close()
    raise preemption.Preempted(message)

  # ==================== Loop ====================
  for failure in restored.corrupt if restored else ():
    record(failure.event())
  if settings_event:
    record(settings_event)
  if restored and isinstance(generator, off_policy.InFlightGenerator):
    record({run_dir.EVENT: metrics.EVENT_IN_FLIGHT_RESTARTED, "first_batch": counters.batches,
            "message": f"resumed in flight at step {counters.step}: sampling restarts at "
                       f"batch {counters.batches} from the restored weights; batches sampled "
                       "after this checkpoint and not trained were discarded (not counted)"})
  if notice.reached(counters.step):  # during start-up: before the step-0 evaluation
    preempt()
  last_eval = run_eval() if restored is None else {}
  if restored is None:
    record(dict(last_eval, **{metrics.TASK_SKIPPED_PREFIX + k: v for k, v in skipped.items()},
                **{metrics.TASK_SKIPPED_ROWS_PREFIX + k: v for k, v in skipped_rows.items()}))
    if notice.reached(counters.step):  # during the evaluation: stop before step 1 compiles
      preempt()
    save()  # the state before any update: kept if a collapse begins at once
  bar = tqdm.tqdm(total=num_steps, initial=counters.step, desc="RL steps", unit="step",
                  dynamic_ncols=True, disable=None if primary else True)
  while counters.step < num_steps:
    if counters.step > (resume_step or 0) and notice.reached(counters.step):
      preempt()
    step_start = time.time()
    step = counters.step
    sampling_values = {}
    if generator is None and config.rl.dynamic_sampling:  # rounds until B_p informative
      collected = collect(step, learner.params)
      scored, prefetched, active, rollout_wait_s = (collected.scored, None, active_problems(),
                                                    None)
      generated_rollouts = collected.generated_rollouts
      sampling_values = dynamic_sampling.metrics(collected.generated_rollouts, collected.rounds)
      counters.batches += 1
    elif generator is None:  # synchronous: sample with the policy this step updates
      chosen = choose(step)
      problems = [train_problems[i] for i in chosen]
      pending = rollout.sample(graphdef, learner.params, tok, book, problems, verifier, n=n,
                               rng=jax.random.fold_in(sample_key, step),
                               sampling=config.sampling)
      prefetched = learner.prefetch(pending)  # devices score while the host decodes and grades
      scored = pending.result()
      if pool is not None:
        pool.update(np.repeat(chosen, n), scored.rewards_GN.reshape(-1))
      active, rollout_wait_s, generated_rollouts = active_problems(), None, n * b_p
      counters.batches += 1
    else:  # off-policy: the batch was sampled ahead, by an older policy version
      generator.publish(step, learner.params)
      generated, rollout_wait_s = generator.take(step)
      scored, prefetched, active = generated.scored, None, generated.active_problems
      generated_rollouts = generated.generated + generated.dropped  # dropped: sampled too
      if config.rl.dynamic_sampling:
        sampling_values = dynamic_sampling.metrics(generated.generated, generated.rounds)
      if config.rl.off_policy != "pipeline_in_flight":
        counters.batches += 1
    # The sampler's freed buffers back to the kernel before the update allocates its own
    # (and, at the end of the step, the update's and a save's before the next sampling).
    host_memory.release_free_memory()
    update_start = time.time()
    result = learner.step(scored, select_rng=jax.random.fold_in(select_key, step),
                          shuffle_rng=jax.random.fold_in(shuffle_key, step),
                          prefetched=prefetched,
                          # the critic's warm-up: its steps leave the policy as it is
                          train_policy=critic is None or step >= config.critic.warmup_steps)
    timings = metrics.step_timings(scored.timings, update_s=time.time() - update_start,
                                   step_s=time.time() - step_start,
                                   rollout_wait_s=rollout_wait_s)
    counters.step += 1
    counters.rollouts += generated_rollouts
    counters.tokens += scored.num_tokens
    counters.wall_s += time.time() - step_start
    values = rl_step.step_metrics(
        config, result,
        learning_rate=schedule(step * config.rl.num_minibatches * config.rl.num_epochs),
        active_problems=active, has_reference=learner.ref_params is not None)
    values.update(sampling_values)
    if generator:
      values.update(off_policy.staleness_metrics(generated, step, config.rl.max_staleness))
    diverged = guard.non_finite(values, step=counters.step,
                                params_finite=bool(guard.all_finite(learner.params)))
    if diverged:
      stop(diverged)  # before anything of this step is evaluated, logged or saved
    counters.collapse_streak, collapsed = guard.collapse(
        values, streak=counters.collapse_streak, collapse_steps=config.guard.collapse_steps,
        stop=config.guard.stop_on_collapse, step=counters.step)
    kept.steps = kept_before_collapse(ckpt, counters)  # before this step's save rotates
    if collapsed and kept.steps:
      counters.kept_step = max(kept.steps)
      collapsed = dict(collapsed, kept_step=counters.kept_step, message=(
          f"{collapsed['message']}; checkpoint step {counters.kept_step}, from before the "
          f"collapse began, is kept (--resume_step={counters.kept_step} goes back to it)"))
    evaluate_now = counters.step in eval_at
    values.update(timings)
    if evaluate_now:
      eval_start = time.time()
      last_eval = run_eval()
      values.update(last_eval, **{metrics.TIME_EVAL: time.time() - eval_start})
    if evaluate_now or counters.step % config.log_every == 0:
      record(values)
    if collapsed and config.guard.stop_on_collapse:
      stop(collapsed)
    elif collapsed:
      logging.warning(collapsed["message"])
      record(collapsed)
    if counters.step % config.checkpoint_every == 0 or counters.step == num_steps:
      save()
    host_memory.release_free_memory()
    bar.update(1)
    bar.set_postfix(reward=f"{values[metrics.TRAIN_REWARD]:.3f}",
                    val=f"{last_eval.get(metrics.val_avg(config.eval.k), float('nan')):.3f}")
  close()
  final = last_eval or {k: v for k, v in run_dir.read_metrics(workdir)[-1].items()
                        if k.startswith(metrics.VAL_PREFIX)}
  # The summary metrics; the per-problem counts are in metrics.jsonl.
  return {k: v for k, v in final.items() if k not in metrics.PER_PROBLEM_COUNTS}
