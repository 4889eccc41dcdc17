"""The jitted policy update: one call per rollout batch, minibatches and epochs inside.

`train_step(graphdef, params, opt_state, batch)` is a pure function of the model's
parameter state, the optax state and a `TrainBatch`; both states are donated, so the
update happens in place on the mesh. With LoRA (`models/lora.py`) `params` are the
adapters and `frozen` the base weights, which are read, not differentiated or donated.
Which estimator, loss, aggregation and KL form it uses are names from the config,
looked up in the registries of `isojax.rl.advantages` / `isojax.rl.losses`; nothing
here branches on a recipe.

Token log-probabilities are those of the tempered policy softmax(logits / temperature),
the distribution the sampler draws from.

Memory. No [B, T, V] logits are ever held: `isojax.rl.logprobs` runs the LM head over
chunks of `logprob_chunk_size` response positions. And one optimizer update (one
minibatch) may hold more rollouts than one forward/backward pass can: it is cut into
micro-batches of `micro_batch_size` rollouts whose gradients a `lax.scan` adds up.
Each micro-batch's loss carries the normalisers of the whole minibatch
(`losses.aggregation_weights`), so the sum is the minibatch loss for every
aggregation, and the diagnostics are computed once from the minibatch's [B, T]
log-probs: the update and its stats do not depend on the split, only the memory does.
Entropy is computed only if it is a loss term or logged (`log_entropy`), the KL
diagnostic only if it is a loss term or logged (`log_kl`); skipped stats are absent.
"""

from __future__ import annotations

import dataclasses
import functools

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from isojax.models import lora
from isojax.rl import logprobs, losses, micro_batches, names
from isojax.rl import settings as rl_settings
from isojax.sampling import settings as sampling_settings

ZERO_VARIANCE_MODES = names.ZERO_VARIANCE_MODES


@flax.struct.dataclass
class TrainBatch:
  """One rollout batch; B = G * n rollouts, P prompt slots, T response slots."""
  tokens: jax.Array         # [B, P + T] int32: left-padded prompt, then response
  mask: jax.Array           # [B, P + T] bool: real tokens
  response_mask: jax.Array  # [B, T] bool: generated tokens (EOS included)
  sampler_logp: jax.Array   # [B, T] float32: log-probs the sampler reported
  old_logp: jax.Array | None  # [B, T] float32: trainer log-probs before this update
                              # (None: the update's own pass, `old_logp_in_pass`)
  ref_logp: jax.Array | None  # [B, T] float32: frozen base-model log-probs (None: none)
  advantages: jax.Array     # [B] float32
  keep_pg: jax.Array        # [B] bool: policy-gradient term applies
  keep_reg: jax.Array       # [B] bool: KL / entropy terms apply
  shuffle_rng: jax.Array    # [] key: minibatch order per epoch
  rewards: jax.Array | None = None  # [B] float32 training rewards (GAE's outcome reward)
  group_ids: jax.Array | None = None  # [B] int32: each row's problem when groups differ in
                                      # size (per-problem allocation); None: consecutive
                                      # groups of `group_size`


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
  """The hashable, static part of the update (`derive`: from the `rl` and `sampling`
  settings)."""
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
  micro_batch_size: int = 0     # rollouts per gradient-accumulation pass; 0: the minibatch
  logprob_chunk_size: int = 0   # response positions per LM-head chunk; 0: unchunked
  length_buckets: int = 0       # k > 0: micro-batches cut to T / 2^j (`response_buckets`)
  log_entropy: bool = True      # compute train/entropy even when entropy_coef == 0
  log_kl: bool = True           # compute train/kl even when kl_coef == 0 (ref_logp given)
  is_level: str = "token"       # the importance correction (losses.importance_weights)
  is_mode: str = "truncate"
  is_sequence_ratio: str = "product"
  frozen: bool = False          # compute the loss and its stats, apply no update (the
                                # critic's warm-up steps)
  old_logp_in_pass: bool = False  # the old log-probs are this pass's own (see below)

  @property
  def need_entropy(self) -> bool:
    return bool(self.entropy_coef) or self.log_entropy

  @property
  def need_kl(self) -> bool:
    return bool(self.kl_coef) or self.log_kl

  @classmethod
  def derive(cls, rl: rl_settings.RLSettings, sampling: sampling_settings.SamplingSettings,
             *, group_size: int, prompt_len: int) -> "UpdateSettings":
    """The update's static settings from the run's `rl` and `sampling` sections: the one
    place they are derived. Runs always log train/entropy."""
    return cls(group_size=group_size, prompt_len=prompt_len,
               temperature=float(sampling.temperature) or 1.0,
               policy_loss=rl.policy_loss, clip_eps=rl.clip_eps,
               clip_eps_high=rl.clip_eps_high, cispo_eps_max=rl.cispo_eps_max,
               aggregation=rl.aggregation,
               constant_normalizer=float(sampling.max_new_tokens),
               kl_coef=rl.kl_coef, kl_form=rl.kl_form, entropy_coef=rl.entropy_coef,
               tis_threshold=rl.tis_threshold, num_minibatches=rl.num_minibatches,
               num_epochs=rl.num_epochs, micro_batch_size=rl.micro_batch_size,
               logprob_chunk_size=rl.logprob_chunk_size, length_buckets=rl.length_buckets,
               log_entropy=True, log_kl=bool(rl.log_kl_to_base), is_level=rl.is_level,
               is_mode=rl.is_mode, is_sequence_ratio=rl.is_sequence_ratio,
               old_logp_in_pass=rl.old_logp_known)


@functools.partial(jax.jit, static_argnames=("graphdef", "prompt_len", "temperature",
                                             "micro_batch_size", "chunk_size",
                                             "length_buckets"))
def score(graphdef, state, tokens_BS, mask_BS, *, prompt_len: int, temperature: float,
          micro_batch_size: int = 0, chunk_size: int = 0, length_buckets: int = 0):
  """Log-probs [B, T] of the response tokens under the model (no gradient).

  One forward over `micro_batch_size` rollouts at a time (0: all B), the LM head in
  chunks of `chunk_size` response positions (0: unchunked); with `length_buckets` k,
  each micro-batch of rows sorted by length is cut as the update's are
  (`response_buckets`). The values do not depend on any of them (to float rounding).
  """
  model = nnx.merge(graphdef, state)
  t = tokens_BS.shape[1] - prompt_len

  def logp(xs, length=t):
    tokens, mask = xs[0][:, :prompt_len + length], xs[1][:, :prompt_len + length]
    out = logprobs.response_logp(model, tokens, mask, prompt_len=prompt_len,
                                 temperature=temperature, chunk_size=chunk_size)[0]
    return jnp.pad(out, ((0, 0), (0, t - length)))

  def cut(xs):
    buckets = micro_batches.response_buckets(t, length_buckets)
    longest = xs[1][:, prompt_len:].sum(axis=1).max()
    return jax.lax.switch(jnp.searchsorted(jnp.asarray(buckets), longest),
                          [functools.partial(logp, length=n) for n in buckets], xs)

  k = micro_batches.num_micro_batches(tokens_BS.shape[0], micro_batch_size,
                                      "the rollout batch")
  run = cut if length_buckets else logp
  if k == 1:
    return run((tokens_BS, mask_BS))
  if not length_buckets:
    return _each_micro(run, (tokens_BS, mask_BS), k)
  order = micro_batches.length_order(mask_BS, k, prompt_len)
  sorted_BT = _each_micro(run, (tokens_BS[order], mask_BS[order]), k)
  return jnp.zeros_like(sorted_BT).at[order].set(sorted_BT)   # back to the rows' order


def _each_micro(fn, tree, k: int):
  """`fn` over k micro-batches of `tree`'s rows, one at a time; its [B, ...] results."""
  return micro_batches.merge_micro(jax.lax.map(fn, micro_batches.split_micro(tree, k)))


def _weights(mb: TrainBatch, s: UpdateSettings):
  """Aggregation weights [B, T] of the policy-gradient and the regulariser terms."""
  agg = functools.partial(losses.aggregation_weights, s.aggregation, group_size=s.group_size,
                          constant_normalizer=s.constant_normalizer,
                          group_ids_B=mb.group_ids)
  return (agg(mb.response_mask & mb.keep_pg[:, None]),
          agg(mb.response_mask & mb.keep_reg[:, None]))


def _old_logp(mb: TrainBatch, logp_BT, s: UpdateSettings):
  """The trainer's log-probs before the update: `mb.old_logp`, or with
  `old_logp_in_pass` this pass's own, without their gradient."""
  return jax.lax.stop_gradient(logp_BT) if s.old_logp_in_pass else mb.old_logp


def _importance_weights(mb: TrainBatch, old_logp_BT, s: UpdateSettings):
  """The sampler/trainer correction of `mb`'s tokens: trainer log-probs before the update
  against the sampler's, per token or per sequence."""
  return losses.importance_weights(old_logp_BT, mb.sampler_logp, mb.response_mask,
                                   s.tis_threshold, level=s.is_level, mode=s.is_mode,
                                   sequence_ratio=s.is_sequence_ratio)


def _weighted_loss(params, graphdef, mb: TrainBatch, w_pg_BT, w_reg_BT, s: UpdateSettings,
                   frozen=None):
  """The share of rows `mb` in their minibatch's loss, and their (logp, entropy) [b, T].

  Every term is a per-token quantity of one row times a weight that holds the whole
  minibatch's normaliser, so the shares of any split of the minibatch add up to its loss.
  """
  model = lora.as_model(graphdef, params, frozen)
  logp_BT, entropy_BT = logprobs.response_logp(
      model, mb.tokens, mb.mask, prompt_len=s.prompt_len, temperature=s.temperature,
      chunk_size=s.logprob_chunk_size, need_entropy=s.need_entropy)
  valid_BT = mb.response_mask
  pg_mask_BT = valid_BT & mb.keep_pg[:, None]
  reg_mask_BT = valid_BT & mb.keep_reg[:, None]
  old_logp_BT = _old_logp(mb, logp_BT, s)
  pg_BT, _ = losses.policy_loss(
      s.policy_loss, logp_BT=logp_BT, old_logp_BT=old_logp_BT, advantages_B=mb.advantages,
      mask_BT=pg_mask_BT, clip_eps=s.clip_eps, clip_eps_high=s.clip_eps_high,
      cispo_eps_max=s.cispo_eps_max)
  tis_w_BT, _ = _importance_weights(mb, old_logp_BT, s)
  # Masked before weighting, as `losses.aggregate` does: padding may hold inf.
  total = lambda w_BT, x_BT, mask_BT: jnp.sum(w_BT * jnp.where(mask_BT, x_BT, 0.0))
  loss = total(w_pg_BT, pg_BT * tis_w_BT, pg_mask_BT)
  if s.kl_coef:
    kl_BT = losses.kl_penalty(s.kl_form, logp_BT, mb.ref_logp)
    loss = loss + s.kl_coef * total(w_reg_BT, kl_BT, reg_mask_BT)
  if s.entropy_coef:
    loss = loss - s.entropy_coef * total(w_reg_BT, entropy_BT, reg_mask_BT)
  return loss, (logp_BT, entropy_BT)


def _stats(mb: TrainBatch, logp_BT, entropy_BT, loss, s: UpdateSettings) -> dict:
  """Diagnostics of one minibatch from its log-probs [B, T], however it was split.

  `entropy` is absent unless `s.need_entropy`, `kl` unless `s.need_kl`.
  """
  logp_BT = jax.lax.stop_gradient(logp_BT)
  valid_BT = mb.response_mask
  old_logp_BT = _old_logp(mb, logp_BT, s)
  _, pg_stats = losses.policy_loss(
      s.policy_loss, logp_BT=logp_BT, old_logp_BT=old_logp_BT, advantages_B=mb.advantages,
      mask_BT=valid_BT & mb.keep_pg[:, None], clip_eps=s.clip_eps,
      clip_eps_high=s.clip_eps_high, cispo_eps_max=s.cispo_eps_max)
  _, tis_stats = _importance_weights(mb, old_logp_BT, s)
  stats = dict(pg_stats, **tis_stats, loss=loss)
  n_valid = jnp.maximum(valid_BT.sum(), 1)
  valid_mean = lambda x_BT: jnp.where(valid_BT, x_BT, 0).sum() / n_valid
  if entropy_BT is not None:
    stats["entropy"] = valid_mean(jax.lax.stop_gradient(entropy_BT))
  if s.need_kl:
    stats["kl"] = valid_mean(losses.kl_penalty("k3", logp_BT, mb.ref_logp))
  return stats


def _cut(micro, length: int, prompt_len: int):
  """A micro-batch (TrainBatch, w_pg [b, T], w_reg [b, T]) with `length` response slots."""
  mb, w_pg_BT, w_reg_BT = micro
  seq = prompt_len + length
  cut_BT = lambda x: None if x is None else x[:, :length]
  mb = mb.replace(tokens=mb.tokens[:, :seq], mask=mb.mask[:, :seq],
                  response_mask=cut_BT(mb.response_mask), sampler_logp=cut_BT(mb.sampler_logp),
                  old_logp=cut_BT(mb.old_logp), ref_logp=cut_BT(mb.ref_logp))
  return mb, cut_BT(w_pg_BT), cut_BT(w_reg_BT)


def _bucketed(grad_fn, params, graphdef, micro, s: UpdateSettings):
  """`grad_fn` on `micro` cut to the shortest bucket that holds its longest response
  (`lax.switch`: one branch runs; each is compiled once). Its (log-probs, entropy) come
  back padded with 0 to T slots."""
  t = micro[0].response_mask.shape[1]
  buckets = micro_batches.response_buckets(t, s.length_buckets)
  longest = micro[0].mask[:, s.prompt_len:].sum(axis=1).max()
  index = jnp.searchsorted(jnp.asarray(buckets), longest)

  def branch(length):
    def run(micro):
      out, grads = grad_fn(params, graphdef, *_cut(micro, length, s.prompt_len), s)
      loss, aux = out
      pad = lambda x: None if x is None else jnp.pad(x, ((0, 0), (0, t - length)))
      return (loss, jax.tree.map(pad, aux)), grads
    return run
  return jax.lax.switch(index, [branch(length) for length in buckets], micro)


def loss_fn(params, graphdef, mb: TrainBatch, s: UpdateSettings, frozen=None):
  """(loss, stats) of one minibatch in a single pass (no micro-batches)."""
  w_pg_BT, w_reg_BT = _weights(mb, s)
  loss, (logp_BT, entropy_BT) = _weighted_loss(params, graphdef, mb, w_pg_BT, w_reg_BT, s,
                                               frozen)
  return loss, _stats(mb, logp_BT, entropy_BT, loss, s)


def minibatch_grads(params, graphdef, mb: TrainBatch, s: UpdateSettings, frozen=None):
  """(gradient, stats) of one minibatch's loss, accumulated over its micro-batches.

  Equal, to float rounding, to the gradient of `loss_fn`; only one micro-batch's
  activations are alive at a time. The scan carries the gradient sum and the loss;
  each micro-batch hands back its log-probs and entropy [b, T] for the diagnostics.
  """
  rows = mb.advantages.shape[0]
  k = micro_batches.num_micro_batches(rows, s.micro_batch_size, "the minibatch",
                         f" (the rollout batch over rl.num_minibatches={s.num_minibatches})")
  if k == 1 and not s.length_buckets:
    (_, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, graphdef, mb, s,
                                                                    frozen)
    return grads, stats
  grad_fn = jax.value_and_grad(functools.partial(_weighted_loss, frozen=frozen), has_aux=True)

  def accumulate(carry, micro):
    grads, loss = carry
    if s.length_buckets:
      (micro_loss, aux), micro_grads = _bucketed(grad_fn, params, graphdef, micro, s)
    else:
      (micro_loss, aux), micro_grads = grad_fn(params, graphdef, *micro, s)
    return (jax.tree.map(jnp.add, grads, micro_grads), loss + micro_loss), aux

  carry = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
  # Rows only: the weights already hold the minibatch's normalisers, and no term
  # needs a micro-batch to hold whole groups. Sorted by length (`length_buckets`), each
  # micro-batch holds responses of similar length, so most are cut short; the loss and
  # the statistics are sums over rows, the same in any order.
  weighted = (mb.replace(shuffle_rng=None), *_weights(mb, s))
  if s.length_buckets:
    order = micro_batches.length_order(mb.mask, k, s.prompt_len)
    weighted = jax.tree.map(lambda x: micro_batches.rows_on_batch(x[order], axis=0), weighted)
    mb = weighted[0]
  micro = micro_batches.split_micro(weighted, k)
  (grads, loss), aux = jax.lax.scan(accumulate, carry, micro)
  logp_BT, entropy_BT = micro_batches.merge_micro(aux)
  return grads, _stats(mb, logp_BT, entropy_BT, loss, s)


def split_minibatches(batch, num: int, group_size: int, rng):
  """[B, ...] -> [num, B / num, ...], whole groups per minibatch, groups shuffled.

  `batch` is a struct dataclass of [B, ...] fields (a `TrainBatch` or the critic's
  `ValueBatch`) and a `shuffle_rng`; None fields stay None.
  """
  per_sequence = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)
                  if f.name != "shuffle_rng" and getattr(batch, f.name) is not None}
  b = batch.tokens.shape[0]
  groups = b // group_size
  order = jax.random.permutation(rng, groups) if num > 1 else jnp.arange(groups)
  rows = (order[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
  split = {k: micro_batches.rows_on_batch(v[rows].reshape(num, b // num, *v.shape[1:]),
                                          axis=1)
           for k, v in per_sequence.items()}
  return batch.replace(**split, shuffle_rng=jnp.broadcast_to(rng, (num,) + rng.shape))


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "settings"),
                   donate_argnames=("params", "opt_state"))
def train_step(graphdef, params, opt_state, batch: TrainBatch, *,
               tx: optax.GradientTransformation, settings: UpdateSettings, frozen=None):
  """num_epochs x num_minibatches optimizer updates. Returns (params, opt_state, stats).

  `frozen`: state merged with `params` into the model but not trained (LoRA's base).
  """
  def one_update(carry, mb):
    params, opt_state = carry
    grads, stats = minibatch_grads(params, graphdef, mb, settings, frozen)
    stats["grad_norm"] = optax.tree.norm(grads)
    if settings.frozen:
      return (params, opt_state), stats
    updates, opt_state = tx.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), stats

  # Unequal groups (per-problem allocation): minibatches of rollouts, not whole groups
  # (each group's advantages were taken before the split).
  group_size = settings.group_size if batch.group_ids is None else 1

  def one_epoch(carry, rng):
    mbs = split_minibatches(batch, settings.num_minibatches, group_size, rng)
    return jax.lax.scan(one_update, carry, mbs)

  rngs = jax.random.split(batch.shuffle_rng, settings.num_epochs)
  (params, opt_state), stats = jax.lax.scan(one_epoch, (params, opt_state), rngs)
  return params, opt_state, {k: _REDUCE.get(k, jnp.mean)(v) for k, v in stats.items()}


# How per-update diagnostics combine over the updates of one step (default: mean).
_REDUCE = {"ratio_max": jnp.max, "ratio_min": jnp.min, "tis/max_abs_logp_diff": jnp.max}
