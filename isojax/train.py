"""The RL loop: sample n rollouts for each of B_p problems, verify, update; M times.

`run(config, workdir)` is the whole job and is importable from a notebook; `main.py`
only parses flags. It reads top to bottom: run directory, mesh, task, model, optimizer,
checkpoint, loop. The problem order and every random key are functions of
(seed, step), so a run resumed from its checkpoint continues exactly where it stopped.
"""

from __future__ import annotations

import dataclasses
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
from isojax.rl import rollout, update
from isojax.tasks import arithmetic, tiny_base_model

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


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains; returns the last evaluation's metrics."""
  config = config_lib.resolve(config)
  n, b_p, num_steps = config.rollouts_per_problem, config.problems_per_batch, config.num_steps
  # ==================== Run directory and checkpoints ====================
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(workdir), options=ocp.CheckpointManagerOptions(
      max_to_keep=2, enable_async_checkpointing=False))
  resume_step = ckpt.latest_step()
  if resume_step is not None:
    _check_resume(workdir, config)
  run_dir.write_config(workdir, config.to_dict())
  writer = run_dir.MetricsWriter(workdir, resume_step=resume_step)

  # ==================== Mesh, task, model ====================
  mesh = sharding.make_mesh(config.mesh)
  train_problems, val_problems = arithmetic.make_splits(
      config.task.seed, config.task.num_train, config.task.num_val, config.task.min_digits,
      config.task.max_digits)
  reward_fn = arithmetic.reward
  policy, tok = load_policy(config, mesh)
  prompt_len = max(len(tok.encode(p.prompt)) for p in train_problems + val_problems)
  graphdef, params = nnx.split(policy)
  keep_reference = config.rl.kl_coef > 0 or config.rl.log_kl_to_base
  ref_params = jax.tree.map(jnp.copy, params) if keep_reference else None
  settings = update.UpdateSettings.from_config(config, group_size=n, prompt_len=prompt_len)

  # ==================== Optimizer and restore ====================
  tx, schedule = update.make_optimizer(config)
  opt_state = jax.jit(tx.init)(params)
  counters = Counters()
  if resume_step is not None:
    restored = ckpt.restore(resume_step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(params), opt_state=ocp.args.StandardRestore(opt_state),
        counters=ocp.args.JsonRestore()))
    params, opt_state = restored.params, restored.opt_state
    counters = Counters(**restored.counters)
    logging.info("resumed %s at step %d (%d rollouts)", workdir, counters.step,
                 counters.rollouts)

  rng = jax.random.key(config.seed)
  sample_key, eval_key, shuffle_key = jax.random.split(rng, 3)

  def record(values: dict) -> None:
    writer.write({run_dir.STEP: counters.step, run_dir.ROLLOUTS: counters.rollouts,
                  run_dir.TOKENS: counters.tokens, run_dir.WALL_S: round(counters.wall_s, 3),
                  **values})

  def run_eval() -> dict[str, float]:
    start = time.time()
    result = evaluation.evaluate(graphdef, params, tok, val_problems, reward_fn, config,
                                 rng=eval_key, prompt_len=prompt_len)
    counters.wall_s += time.time() - start
    logging.info("step %d eval: %s", counters.step,
                 " ".join(f"{k}={v:.4f}" for k, v in result.items()))
    return result

  def save() -> None:
    ckpt.save(counters.step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), opt_state=ocp.args.StandardSave(opt_state),
        counters=ocp.args.JsonSave(dataclasses.asdict(counters))), force=True)

  # ==================== Loop ====================
  last_eval = run_eval() if counters.step == 0 else {}
  if counters.step == 0:
    record(last_eval)
  bar = tqdm.tqdm(total=num_steps, initial=counters.step, desc="RL steps", unit="step",
                  dynamic_ncols=True, disable=None)
  while counters.step < num_steps:
    step_start = time.time()
    step = counters.step
    chosen = problems_for_step(config.seed, step, len(train_problems), b_p)
    problems = [train_problems[i] for i in chosen]
    scored = rollout.generate(graphdef, params, tok, problems, reward_fn, n=n,
                              rng=jax.random.fold_in(sample_key, step), prompt_len=prompt_len,
                              sampling=config.sampling)
    tokens, mask = rollout.sequences(scored, n)
    tokens, mask = jnp.asarray(tokens), jnp.asarray(mask)
    rewards = jnp.asarray(scored.rewards_GN)
    adv_GN = advantages_lib.compute_advantages(config.rl.advantage, rewards,
                                               eps=config.rl.advantage_eps)
    zero_var_G = np.asarray(advantages_lib.zero_variance_groups(rewards))
    keep_pg, keep_reg = _filter_masks(config.rl.zero_variance_filter, zero_var_G, n)
    old_logp = update.score(graphdef, params, tokens, mask, prompt_len=prompt_len,
                            temperature=settings.temperature)
    ref_logp = old_logp if ref_params is None else update.score(
        graphdef, ref_params, tokens, mask, prompt_len=prompt_len,
        temperature=settings.temperature)
    batch = sharding.shard_batch(update.TrainBatch(
        tokens=tokens, mask=mask, response_mask=scored.rollouts.mask,
        sampler_logp=scored.rollouts.logprobs, old_logp=old_logp, ref_logp=ref_logp,
        advantages=adv_GN.reshape(-1), keep_pg=jnp.asarray(keep_pg),
        keep_reg=jnp.asarray(keep_reg), shuffle_rng=None), mesh)
    batch = batch.replace(shuffle_rng=jax.random.fold_in(shuffle_key, step))
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


def _filter_masks(mode: str, zero_var_G: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
  """[B] masks of sequences kept in the policy-gradient and the regulariser terms."""
  keep = np.repeat(~zero_var_G, n)
  everything = np.ones_like(keep)
  if mode == "off":
    return everything, everything
  if mode == "all":
    return keep, keep
  if mode == "regularizers":
    return everything, keep
  raise ValueError(f"rl.zero_variance_filter={mode!r}: expected one of "
                   f"{update.ZERO_VARIANCE_MODES}")
