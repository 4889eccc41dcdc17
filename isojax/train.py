"""The RL loop: sample n rollouts for each of B_p problems, verify, update; M times.

`run(config, workdir)` is the whole job and is importable from a notebook; `main.py`
only parses flags. It reads top to bottom: run directory, mesh, task, model, optimizer,
checkpoint, loop. The problem order and every random key are functions of
(seed, step), so a run resumed from its checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
import logging as std_logging
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import tqdm
from absl import logging
from flax import nnx

from isojax import config_lib, evaluation, metrics, run_dir
from isojax.models import hf_checkpoint, sharding
from isojax.models import tokenizer as tokenizer_lib
from isojax.rl import advantages as advantages_lib
from isojax.rl import downsampling, problem_pool, rollout, update
from isojax import tasks
from isojax.tasks import tiny_base_model

# Allocation fields that must not change when a run resumes.
_RESUME_INVARIANTS = ("rollouts_per_problem", "problems_per_batch", "num_steps", "seed")


@dataclasses.dataclass
class Counters:
  """Cumulative compute, restored with the checkpoint."""
  step: int = 0
  rollouts: int = 0
  tokens: int = 0
  wall_s: float = 0.0


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


def load_policy(config: ml_collections.ConfigDict, mesh):
  """(model, tokenizer) from `base_model.path`, or the cached tiny model."""
  path = config.base_model.path or tiny_base_model.ensure_base_model(config.base_model,
                                                                     config.task)
  model = hf_checkpoint.load_model(path, mesh, dtype=config.model.dtype,
                                   fp32_lm_head=config.model.fp32_lm_head)
  return model, tokenizer_lib.load_tokenizer(path)


def _check_resume(workdir: str, config: ml_collections.ConfigDict) -> None:
  saved = run_dir.read_config(workdir)
  changed = [f for f in _RESUME_INVARIANTS if saved.get(f) != config[f]]
  if changed:
    raise ValueError(
        f"{run_dir.config_path(workdir)}: the run in this workdir has different "
        f"{', '.join(f'{f}={saved.get(f)}' for f in changed)}; use a new --workdir")


class _DropLibraryInfo(std_logging.Filter):
  """Orbax logs every save step at INFO through absl; keep its warnings only."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains; returns the last evaluation's metrics."""
  config = config_lib.resolve(config)
  handler = logging.get_absl_handler()
  if not any(isinstance(f, _DropLibraryInfo) for f in handler.filters):
    handler.addFilter(_DropLibraryInfo())
  n, b_p, num_steps = config.rollouts_per_problem, config.problems_per_batch, config.num_steps
  # ==================== Mesh and task (fail fast, before anything is written) ====
  mesh = sharding.make_mesh(config.mesh)
  train_problems, val_problems = tasks.load_problems(config.task)
  if b_p > len(train_problems):
    raise ValueError(f"problems_per_batch={b_p} exceeds the {len(train_problems)} training "
                     f"problems of task.split={config.task.split!r}")
  reward_fn = tasks.reward_fn(config.task)

  # ==================== Run directory and checkpoints ====================
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(workdir), options=ocp.CheckpointManagerOptions(
      max_to_keep=2, enable_async_checkpointing=False))
  resume_step = ckpt.latest_step()
  if resume_step is not None:
    _check_resume(workdir, config)
  primary = jax.process_index() == 0  # one writer per job, however many hosts
  if primary:
    run_dir.write_config(workdir, config.to_dict())
  writer = run_dir.MetricsWriter(workdir, resume_step=resume_step, enabled=primary)

  # ==================== Model ====================
  policy, tok = load_policy(config, mesh)
  prompt_len = max(len(tok.encode(p.prompt)) for p in train_problems + val_problems)
  graphdef, params = nnx.split(policy)
  keep_reference = config.rl.kl_coef > 0 or config.rl.log_kl_to_base
  ref_params = jax.tree.map(jnp.copy, params) if keep_reference else None
  settings = update.UpdateSettings.from_config(
      config, group_size=config_lib.train_rollouts_per_problem(config), prompt_len=prompt_len)
  pool = (problem_pool.ProblemPool(len(train_problems), threshold=config.rl.retire_pass_rate)
          if config.rl.retire_pass_rate > 0 else None)

  # ==================== Optimizer and restore ====================
  tx, schedule = update.make_optimizer(config)
  opt_state = jax.jit(tx.init)(params)
  counters = Counters()
  if resume_step is not None:
    restored = ckpt.restore(resume_step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(params), opt_state=ocp.args.StandardRestore(opt_state),
        counters=ocp.args.JsonRestore()))
    params, opt_state = restored.params, restored.opt_state
    counters = Counters(**restored.counters.pop("counters"))
    if pool is not None:
      pool = problem_pool.ProblemPool.from_dict(
          {k: np.asarray(v) for k, v in restored.counters["pool"].items()})
    logging.info("resumed %s at step %d (%d rollouts)", workdir, counters.step,
                 counters.rollouts)

  rng = jax.random.key(config.seed)
  sample_key, eval_key, shuffle_key, select_key = jax.random.split(rng, 4)

  def record(values: dict) -> None:
    writer.write({run_dir.STEP: counters.step, run_dir.ROLLOUTS: counters.rollouts,
                  run_dir.TOKENS: counters.tokens, run_dir.WALL_S: round(counters.wall_s, 3),
                  **values})

  def run_eval() -> dict[str, float]:
    start = time.time()
    result = evaluation.evaluate(graphdef, params, tok, val_problems, reward_fn, config,
                                 rng=eval_key, prompt_len=prompt_len)
    if config.eval.train_problems:
      result[metrics.TRAIN_PASS1_HISTOGRAM] = evaluation.pass_rate_histogram(
          graphdef, params, tok, train_problems[:config.eval.train_problems], reward_fn,
          config, rng=eval_key, prompt_len=prompt_len)
    counters.wall_s += time.time() - start
    logging.info("step %d eval: %s", counters.step, " ".join(
        f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()))
    return result

  def save() -> None:
    ckpt.save(counters.step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
        counters=ocp.args.JsonSave(dict(
            counters=dataclasses.asdict(counters),
            pool={k: v.tolist() for k, v in pool.to_dict().items()} if pool else None))),
              force=True)

  # ==================== Loop ====================
  last_eval = run_eval() if counters.step == 0 else {}
  if counters.step == 0:
    record(last_eval)
  bar = tqdm.tqdm(total=num_steps, initial=counters.step, desc="RL steps", unit="step",
                  dynamic_ncols=True, disable=None if primary else True)
  while counters.step < num_steps:
    step_start = time.time()
    step = counters.step
    if pool is None:
      chosen = problems_for_step(config.seed, step, len(train_problems), b_p)
    else:
      chosen = pool.sample(np.random.default_rng([config.seed, step]), b_p)
    problems = [train_problems[i] for i in chosen]
    scored = rollout.generate(graphdef, params, tok, problems, reward_fn, n=n,
                              rng=jax.random.fold_in(sample_key, step), prompt_len=prompt_len,
                              sampling=config.sampling)
    if pool is not None:
      pool.update(np.repeat(chosen, n), scored.rewards_GN.reshape(-1))
    batch, zero_var_G = build_train_batch(
        config, scored, select_rng=jax.random.fold_in(select_key, step))
    batch = sharding.shard_batch(batch, mesh)
    old_logp = update.score(graphdef, params, batch.tokens, batch.mask, prompt_len=prompt_len,
                            temperature=settings.temperature)
    ref_logp = old_logp if ref_params is None else update.score(
        graphdef, ref_params, batch.tokens, batch.mask, prompt_len=prompt_len,
        temperature=settings.temperature)
    batch = batch.replace(old_logp=old_logp, ref_logp=ref_logp,
                          shuffle_rng=jax.random.fold_in(shuffle_key, step))
    params, opt_state, stats = update.train_step(graphdef, params, opt_state, batch, tx=tx,
                                                 settings=settings)
    stats = jax.device_get(stats)
    counters.step += 1
    counters.rollouts += n * b_p
    counters.tokens += scored.num_tokens
    counters.wall_s += time.time() - step_start

    values = {
        metrics.TRAIN_REWARD: float(scored.rewards_GN.mean()),
        metrics.TRAIN_ENTROPY: float(stats.pop("entropy")),
        metrics.TRAIN_LOSS: float(stats.pop("loss")),
        metrics.TRAIN_CLIP_FRACTION: float(stats.pop("clip_fraction")),
        metrics.TRAIN_GRAD_NORM: float(stats.pop("grad_norm")),
        metrics.TRAIN_LR: float(schedule(step * config.rl.num_minibatches * config.rl.num_epochs)),
        metrics.TRAIN_ZERO_VARIANCE: float(zero_var_G.mean()),
        metrics.TRAIN_RESPONSE_LENGTH: scored.num_tokens / (n * b_p),
        metrics.TRAIN_ACTIVE_PROBLEMS: len(train_problems) if pool is None else int(
            pool.active_ids().size),
    }
    kl = stats.pop("kl")
    if ref_params is not None:
      values[metrics.TRAIN_KL] = float(kl)
    values.update({f"train/{k}": float(v) for k, v in stats.items()})
    evaluate_now = counters.step % config.eval.every == 0 or counters.step == num_steps
    if evaluate_now:
      last_eval = run_eval()
      values.update(last_eval)
    if evaluate_now or counters.step % config.log_every == 0:
      record(values)
    if counters.step % config.checkpoint_every == 0 or counters.step == num_steps:
      save()
    bar.update(1)
    bar.set_postfix(reward=f"{values[metrics.TRAIN_REWARD]:.3f}",
                    val=f"{last_eval.get(metrics.val_avg(config.eval.k), float('nan')):.3f}")
  bar.close()
  ckpt.wait_until_finished()
  ckpt.close()
  return last_eval or {k: v for k, v in run_dir.read_metrics(workdir)[-1].items()
                       if k.startswith(metrics.VAL_PREFIX)}


def _filter_masks(mode: str, zero_var_G: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
  """[B] masks of sequences kept in the policy-gradient and the regulariser terms."""
  keep = np.repeat(~zero_var_G, m)
  everything = np.ones_like(keep)
  if mode == "off":
    return everything, everything
  if mode == "all":
    return keep, keep
  if mode == "regularizers":
    return everything, keep
  raise ValueError(f"rl.zero_variance_filter={mode!r}: expected one of "
                   f"{update.ZERO_VARIANCE_MODES}")


def build_train_batch(config: ml_collections.ConfigDict, scored: rollout.ScoredRollouts, *,
                      select_rng: jax.Array) -> tuple[update.TrainBatch, np.ndarray]:
  """Advantages, PODS down-sampling (n -> m per group) and zero-variance masks.

  Returns a host (NumPy) batch whose old/ref log-probs and shuffle key the caller
  fills after sharding it, and the [G] zero-variance flags of the trained groups.
  """
  rl = config.rl
  n, m = config.rollouts_per_problem, config_lib.train_rollouts_per_problem(config)
  rewards_GN = jnp.asarray(scored.rewards_GN)
  g = rewards_GN.shape[0]
  if rl.downsample == "none":
    rows = np.arange(g * n)
    rewards_GM = rewards_GN
    adv_GM = advantages_lib.compute_advantages(rl.advantage, rewards_GN, eps=rl.advantage_eps)
  else:
    idx_GM = downsampling.select_rollouts(rl.downsample, rewards_GN, m, rng=select_rng)
    rows = (np.arange(g)[:, None] * n + np.asarray(idx_GM)).reshape(-1)
    rewards_GM = downsampling.gather_groups(rewards_GN, idx_GM)
    if rl.advantages_on == "generated":  # decoupled baseline: statistics from all n
      adv_GM = downsampling.gather_groups(advantages_lib.compute_advantages(
          rl.advantage, rewards_GN, eps=rl.advantage_eps), idx_GM)
    else:
      adv_GM = advantages_lib.compute_advantages(rl.advantage, rewards_GM,
                                                 eps=rl.advantage_eps)
  zero_var_G = np.asarray(advantages_lib.zero_variance_groups(rewards_GM))
  keep_pg, keep_reg = _filter_masks(rl.zero_variance_filter, zero_var_G, m)
  tokens, mask = rollout.sequences(scored, n)
  response_mask = scored.rollouts.mask[rows]
  batch = update.TrainBatch(
      tokens=tokens[rows], mask=mask[rows], response_mask=response_mask,
      sampler_logp=scored.rollouts.logprobs[rows],
      old_logp=np.zeros(response_mask.shape, np.float32),
      ref_logp=np.zeros(response_mask.shape, np.float32),
      advantages=np.asarray(adv_GM).reshape(-1), keep_pg=keep_pg, keep_reg=keep_reg,
      shuffle_rng=None)
  return batch, zero_var_G
