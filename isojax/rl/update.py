"""The jitted policy update: one call per rollout batch, minibatches and epochs inside.

`train_step(graphdef, params, opt_state, batch)` is a pure function of the model's
parameter state, the optax state and a `TrainBatch`; both states are donated, so the
update happens in place on the mesh. Which estimator, loss, aggregation and KL form
it uses are names from the config, looked up in the registries of
`isojax.rl.advantages` / `isojax.rl.losses`; nothing here branches on a recipe.

Token log-probabilities are those of the tempered policy softmax(logits / temperature),
the distribution the sampler draws from.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx

from isojax import config_lib
from isojax.rl import losses

ZERO_VARIANCE_MODES = ("off", "all", "regularizers")


@flax.struct.dataclass
class TrainBatch:
  """One rollout batch; B = G * n rollouts, P prompt slots, T response slots."""
  tokens: jax.Array         # [B, P + T] int32: left-padded prompt, then response
  mask: jax.Array           # [B, P + T] bool: real tokens
  response_mask: jax.Array  # [B, T] bool: generated tokens (EOS included)
  sampler_logp: jax.Array   # [B, T] float32: log-probs the sampler reported
  old_logp: jax.Array       # [B, T] float32: trainer log-probs before this update
  ref_logp: jax.Array       # [B, T] float32: frozen base-model log-probs
  advantages: jax.Array     # [B] float32
  keep_pg: jax.Array        # [B] bool: policy-gradient term applies
  keep_reg: jax.Array       # [B] bool: KL / entropy terms apply
  shuffle_rng: jax.Array    # [] key: minibatch order per epoch


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
  """The hashable, static part of the update (from `config.rl` and friends)."""
  group_size: int
  prompt_len: int
  temperature: float
  policy_loss: str
  clip_eps: float
  clip_eps_high: float
  cispo_eps_max: float
  aggregation: str
  constant_normalizer: float
  kl_coef: float
  kl_form: str
  entropy_coef: float
  tis_threshold: float
  num_minibatches: int
  num_epochs: int

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, group_size: int,
                  prompt_len: int) -> "UpdateSettings":
    rl = config.rl
    return cls(group_size=group_size, prompt_len=prompt_len,
               temperature=float(config.sampling.temperature) or 1.0,
               policy_loss=rl.policy_loss, clip_eps=rl.clip_eps,
               clip_eps_high=rl.clip_eps_high, cispo_eps_max=rl.cispo_eps_max,
               aggregation=rl.aggregation,
               constant_normalizer=float(config.sampling.max_new_tokens),
               kl_coef=rl.kl_coef, kl_form=rl.kl_form, entropy_coef=rl.entropy_coef,
               tis_threshold=rl.tis_threshold, num_minibatches=rl.num_minibatches,
               num_epochs=rl.num_epochs)


def make_optimizer(config: ml_collections.ConfigDict) -> tuple[optax.GradientTransformation,
                                                                optax.Schedule]:
  """AdamW with linear warm-up then constant LR, peak scaled with the rollout batch."""
  o = config.optim
  updates_per_step = config.rl.num_minibatches * config.rl.num_epochs
  schedule = optax.warmup_constant_schedule(
      0.0, config_lib.learning_rate(config), max(o.warmup_steps * updates_per_step, 1))
  tx = optax.chain(
      optax.clip_by_global_norm(o.grad_clip_norm) if o.grad_clip_norm else optax.identity(),
      optax.adamw(schedule, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay))
  return tx, schedule


def response_logits(model, tokens_BS, mask_BS, prompt_len: int, temperature: float):
  """Tempered logits [B, T, V] at the positions that predict the response tokens."""
  hidden = model.hidden_states(tokens_BS, mask_BS)
  return model.logits(hidden[:, prompt_len - 1:-1]) / temperature


def token_logp(logits_BTV, tokens_BT):
  logp = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, tokens_BT[..., None], axis=-1)[..., 0]


@functools.partial(jax.jit, static_argnames=("graphdef", "prompt_len", "temperature"))
def score(graphdef, state, tokens_BS, mask_BS, *, prompt_len: int, temperature: float):
  """Log-probs [B, T] of the response tokens under the model (no gradient)."""
  model = nnx.merge(graphdef, state)
  logits = response_logits(model, tokens_BS, mask_BS, prompt_len, temperature)
  return token_logp(logits, tokens_BS[:, prompt_len:])


def loss_fn(params, graphdef, mb: TrainBatch, s: UpdateSettings):
  model = nnx.merge(graphdef, params)
  logits = response_logits(model, mb.tokens, mb.mask, s.prompt_len, s.temperature)
  logp = token_logp(logits, mb.tokens[:, s.prompt_len:])
  valid = mb.response_mask
  pg_mask = valid & mb.keep_pg[:, None]
  reg_mask = valid & mb.keep_reg[:, None]
  pg_BT, pg_stats = losses.policy_loss(
      s.policy_loss, logp_BT=logp, old_logp_BT=mb.old_logp, advantages_B=mb.advantages,
      mask_BT=pg_mask, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high,
      cispo_eps_max=s.cispo_eps_max)
  tis_w, tis_stats = losses.truncated_is_weights(mb.old_logp, mb.sampler_logp, valid,
                                                 s.tis_threshold)
  agg = functools.partial(losses.aggregate, s.aggregation, group_size=s.group_size,
                          constant_normalizer=s.constant_normalizer)
  loss = agg(pg_BT * tis_w, pg_mask)
  entropy_BT = losses.token_entropy(logits)
  kl_BT = losses.kl_penalty(s.kl_form, logp, mb.ref_logp)
  if s.kl_coef:
    loss = loss + s.kl_coef * agg(kl_BT, reg_mask)
  if s.entropy_coef:
    loss = loss - s.entropy_coef * agg(entropy_BT, reg_mask)
  n_valid = jnp.maximum(valid.sum(), 1)
  stats = dict(pg_stats, **tis_stats,
               loss=loss,
               entropy=jnp.where(valid, entropy_BT, 0).sum() / n_valid,
               kl=jnp.where(valid, losses.kl_penalty("k3", logp, mb.ref_logp), 0).sum()
               / n_valid)
  return loss, stats


def _split_minibatches(batch: TrainBatch, num: int, group_size: int, rng) -> TrainBatch:
  """[B, ...] -> [num, B / num, ...], whole groups per minibatch, groups shuffled."""
  per_sequence = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
                  if f.name != "shuffle_rng"}
  b = batch.advantages.shape[0]
  groups = b // group_size
  order = jax.random.permutation(rng, groups) if num > 1 else jnp.arange(groups)
  rows = (order[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
  split = {k: v[rows].reshape(num, b // num, *v.shape[1:]) for k, v in per_sequence.items()}
  return TrainBatch(**split, shuffle_rng=jnp.broadcast_to(rng, (num,) + rng.shape))


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "settings"),
                   donate_argnames=("params", "opt_state"))
def train_step(graphdef, params, opt_state, batch: TrainBatch, *,
               tx: optax.GradientTransformation, settings: UpdateSettings):
  """num_epochs x num_minibatches optimizer updates. Returns (params, opt_state, stats)."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def one_update(carry, mb):
    params, opt_state = carry
    (_, stats), grads = grad_fn(params, graphdef, mb, settings)
    updates, opt_state = tx.update(grads, opt_state, params)
    stats["grad_norm"] = optax.tree.norm(grads)
    return (optax.apply_updates(params, updates), opt_state), stats

  def one_epoch(carry, rng):
    mbs = _split_minibatches(batch, settings.num_minibatches, settings.group_size, rng)
    return jax.lax.scan(one_update, carry, mbs)

  rngs = jax.random.split(batch.shuffle_rng, settings.num_epochs)
  (params, opt_state), stats = jax.lax.scan(one_epoch, (params, opt_state), rngs)
  return params, opt_state, {k: _REDUCE.get(k, jnp.mean)(v) for k, v in stats.items()}


# How per-update diagnostics combine over the updates of one step (default: mean).
_REDUCE = {"ratio_max": jnp.max, "ratio_min": jnp.min, "tis/max_abs_logp_diff": jnp.max}
