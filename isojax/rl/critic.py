"""PPO's critic: a value model, GAE advantages from its values, and its jitted update.

With `rl.advantage=gae` every response token gets its own advantage from a learned
value function instead of its group's rewards. The value model is a decoder of the
policy's family with a scalar head on its final hidden states: initialised from the
policy's weights (`critic.path` empty) or loaded from a checkpoint directory with the
policy's vocabulary. Its LM head is dropped (values need none). `critic.train_trunk`
False trains the head alone: the trunk's activations are cut from the gradient and the
optimizer holds no state for them. `critic.trunk="policy"` puts the head on the
policy's own trunk instead: the critic's state is the head alone, and each step reads
the policy's current weights as its (frozen, not donated) trunk, so no second decoder
is held; the policy's loss alone trains the trunk.

V(s_t), the value of response token t's state, is read where the policy reads the
logits of token t (position P - 1 + t), so values and log-probs line up [B, T].
`advantages` turns the outcome rewards and the values before the update into GAE
advantages (whitened over the batch's tokens, as PPO implementations do) and returns;
`critic_step` then regresses the values on the returns with PPO's clipped value loss,
over the same minibatches, epochs and micro-batches as the policy update.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from isojax.models import hf_checkpoint, lora, sharding, transformer
from isojax.models import settings as model_settings
from isojax.models.transformer import Transformer
from isojax.rl import advantages as advantages_lib
from isojax.rl import settings as rl_settings
from isojax.rl import micro_batches, optimizer, update


class ValueModel(nnx.Module):
  """A decoder trunk and a scalar value head on its final hidden states."""

  def __init__(self, trunk: Transformer, *, rngs: nnx.Rngs):
    self.trunk = trunk
    # Zero-initialised: the first values are 0, so the first advantages are the returns.
    self.head = nnx.Linear(
        trunk.cfg.embed_dim, 1, rngs=rngs,
        kernel_init=nnx.with_partitioning(nnx.initializers.zeros_init(), ("embed", None)),
        bias_init=nnx.with_partitioning(nnx.initializers.zeros_init(), (None,)))

  def values(self, tokens_BS: jax.Array, mask_BS: jax.Array, *, prompt_len: int,
             train_trunk: bool = True) -> jax.Array:
    """V [B, T] float32 of the states before each of the T response tokens."""
    hidden_BTD = self.trunk.hidden_states(tokens_BS, mask_BS)[:, prompt_len - 1:-1]
    hidden_BTD = self.trunk.final_norm(hidden_BTD)
    if not train_trunk:
      hidden_BTD = jax.lax.stop_gradient(hidden_BTD)
    kernel_D1 = self.head.kernel[...].astype(jnp.float32)
    return (hidden_BTD.astype(jnp.float32) @ kernel_D1)[..., 0] + self.head.bias[...][0]


def build(critic: rl_settings.CriticSettings, model: model_settings.ModelSettings, mesh,
          policy_graphdef, policy_params) -> tuple[Any, Any]:
  """(graphdef, params) of the critic on `mesh`: from `critic.path`, or a copy of the
  policy's weights; the trunk's LM head removed, a zero value head added. With
  `critic.trunk="policy"`, params are the head's alone (`policy_trunk` gives the rest)."""
  shared = critic.trunk == "policy"
  if critic.path:
    trunk = hf_checkpoint.load_model(critic.path, mesh, **model.as_kwargs())
  else:
    trunk = nnx.merge(policy_graphdef, policy_params if shared
                      else jax.tree.map(jnp.copy, policy_params))
  if hasattr(trunk, "lm_head"):
    del trunk.lm_head
  with nnx.use_eager_sharding(False):
    model = ValueModel(trunk, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  head = jax.device_put(nnx.state(model.head), sharding.state_shardings(
      nnx.state(model.head), mesh))
  nnx.update(model.head, head)
  return graphdef, _own_state(nnx.state(model), shared)


def _own_state(state, shared: bool):
  """The critic's own state: the whole value model, or with `critic.trunk="policy"` the
  head alone (the policy's weights are its trunk: `policy_trunk`)."""
  return nnx.State({"head": state["head"]}) if shared else state


def policy_trunk(policy_params):
  """The policy's state as a critic's trunk (`critic.trunk="policy"`): the same arrays,
  keyed as `ValueModel` keys them, without the LM head."""
  return nnx.State({"trunk": nnx.State({k: v for k, v in policy_params.items()
                                        if k != "lm_head"})})


def abstract(model_cfg: transformer.ModelConfig, mesh, trunk: str) -> tuple[Any, Any]:
  """(graphdef, params) of a critic on a trunk of `model_cfg` as `build` makes them on
  `mesh`, as placed `jax.ShapeDtypeStruct`s (nothing initialised), for `launch.aot`;
  `trunk` is `critic.trunk`."""
  def make():
    trunk = Transformer(model_cfg, rngs=nnx.Rngs(0))
    if hasattr(trunk, "lm_head"):
      del trunk.lm_head
    with nnx.use_eager_sharding(False):
      return ValueModel(trunk, rngs=nnx.Rngs(0))

  with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((), ())):
    graphdef, state = nnx.split(nnx.eval_shape(make))
  placed = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        state, sharding.state_shardings(state, mesh))
  return graphdef, _own_state(placed, trunk == "policy")


def opt_state_shardings(tx: optax.GradientTransformation, params, mesh, train_trunk: bool):
  """Where `tx.init(params)` lives: beside the parameters (`optimizer.opt_state_shardings`);
  with a frozen trunk only the head has moments (D + 1 numbers each), replicated."""
  if train_trunk:
    return optimizer.opt_state_shardings(tx, params, mesh)
  return sharding.replicated(mesh)


def check_vocabulary(critic: rl_settings.CriticSettings, model: model_settings.ModelSettings,
                     policy_path: str) -> None:
  """A critic loaded from `critic.path` reads the policy's tokens: same vocabulary size.

  Reads the config.json files and the critic's file headers only (`check_files`),
  before anything is loaded, compiled or written."""
  if not critic.path:
    return
  hf_checkpoint.check_files(critic.path, **model.as_kwargs())
  policy = hf_checkpoint.read_hf_config(policy_path)["vocab_size"]
  vocab = hf_checkpoint.read_hf_config(critic.path)["vocab_size"]
  if vocab != policy:
    raise ValueError(f"critic.path={critic.path!r}: vocab_size {vocab} differs from "
                     f"the policy's {policy} ({policy_path}); the critic reads the policy's "
                     "token ids")


def trunk_mask(params) -> Any:
  """True on the parameters the critic's optimizer trains when the trunk is frozen."""
  return jax.tree_util.tree_map_with_path(lambda path, _: path[0].key == "head", params)


def make_optimizer(critic: rl_settings.CriticSettings, optim: rl_settings.OptimSettings, *,
                   warmup_steps: int, updates_per_step: int) -> optax.GradientTransformation:
  """AdamW at `critic.learning_rate` with the policy's warm-up (`warmup_steps` RL steps),
  betas, decay and clip; with a frozen trunk, over the head only (no moments for the
  trunk)."""
  schedule = optimizer.warmup_schedule(critic.learning_rate, warmup_steps * updates_per_step)
  tx = optimizer.adamw(optim, schedule)
  return tx if critic.train_trunk else optax.masked(tx, trunk_mask)


def init_optimizer(tx: optax.GradientTransformation, params, mesh, train_trunk: bool, *,
                   abstract: bool = False):
  """`tx.init(params)` placed by `opt_state_shardings` (`optimizer.init_optimizer`)."""
  return optimizer.init_optimizer(tx, params, opt_state_shardings(tx, params, mesh, train_trunk),
                               abstract=abstract)


@flax.struct.dataclass
class ValueBatch:
  """What the critic's update regresses on; B rollouts, P prompt slots, T response slots."""
  tokens: jax.Array         # [B, P + T] int32
  mask: jax.Array           # [B, P + T] bool
  response_mask: jax.Array  # [B, T] bool: the policy's tokens (the states valued)
  old_values: jax.Array     # [B, T] float32: values before this update
  returns: jax.Array        # [B, T] float32: GAE returns, the regression target
  shuffle_rng: jax.Array    # [] key: minibatch order per epoch


@dataclasses.dataclass(frozen=True)
class ValueUpdateSettings:
  """The hashable, static part of the critic's update (`derive`: from the `critic` and
  `rl` settings)."""
  prompt_len: int
  value_clip: float
  train_trunk: bool
  group_size: int
  num_minibatches: int
  num_epochs: int
  micro_batch_size: int = 0

  @classmethod
  def derive(cls, critic: rl_settings.CriticSettings, rl: rl_settings.RLSettings, *,
             group_size: int, prompt_len: int = 0) -> "ValueUpdateSettings":
    return cls(prompt_len=prompt_len, value_clip=float(critic.value_clip),
               train_trunk=bool(critic.train_trunk), group_size=group_size,
               num_minibatches=rl.num_minibatches, num_epochs=rl.num_epochs,
               micro_batch_size=rl.micro_batch_size)


def value_loss(values_BT: jax.Array, old_values_BT: jax.Array, returns_BT: jax.Array,
               mask_BT: jax.Array, *, clip: float) -> tuple[jax.Array, jax.Array]:
  """Per-token PPO value loss [B, T] (0 off the mask) and where the clipped term is used.

  0.5 * max((V - R)^2, (clip(V, V_old - clip, V_old + clip) - R)^2); clip 0: unclipped.
  """
  unclipped_BT = jnp.square(values_BT - returns_BT)
  if not clip:
    return jnp.where(mask_BT, 0.5 * unclipped_BT, 0.0), jnp.zeros(mask_BT.shape, bool)
  clipped_BT = jnp.square(
      jnp.clip(values_BT, old_values_BT - clip, old_values_BT + clip) - returns_BT)
  return (jnp.where(mask_BT, 0.5 * jnp.maximum(unclipped_BT, clipped_BT), 0.0),
          mask_BT & (clipped_BT > unclipped_BT))


@functools.partial(jax.jit, static_argnames=("graphdef", "prompt_len", "micro_batch_size"))
def values(graphdef, state, tokens_BS, mask_BS, *, prompt_len: int, micro_batch_size: int = 0,
           frozen=None):
  """V [B, T] of every response token's state (no gradient), micro-batched as `score`.
  `frozen`: the policy's trunk when the head sits on it (`policy_trunk`)."""
  model = lora.as_model(graphdef, state, frozen)
  fn = lambda xs: model.values(*xs, prompt_len=prompt_len)
  k = micro_batches.num_micro_batches(tokens_BS.shape[0], micro_batch_size, "the rollout batch")
  if k == 1:
    return fn((tokens_BS, mask_BS))
  return micro_batches.merge_micro(
      jax.lax.map(fn, micro_batches.split_micro((tokens_BS, mask_BS), k)))


@functools.partial(jax.jit, static_argnames=("gamma", "lam"))
def advantages(rewards_B, old_values_BT, response_mask_BT, *, gamma: float, lam: float
               ) -> tuple[jax.Array, jax.Array]:
  """(whitened GAE advantages [B, T], returns [B, T]) from the values before the update."""
  adv_BT, returns_BT = advantages_lib.gae(rewards_B, old_values_BT, response_mask_BT,
                                          gamma=gamma, lam=lam)
  return advantages_lib.whiten(adv_BT, response_mask_BT), returns_BT


def _minibatch_loss(params, graphdef, mb: ValueBatch, weights_BT, s: ValueUpdateSettings,
                    frozen=None):
  """The share of rows `mb` in their minibatch's token-mean value loss."""
  model = lora.as_model(graphdef, params, frozen)
  values_BT = model.values(mb.tokens, mb.mask, prompt_len=s.prompt_len,
                           train_trunk=s.train_trunk)
  loss_BT, clipped_BT = value_loss(values_BT, mb.old_values, mb.returns, mb.response_mask,
                                   clip=s.value_clip)
  return jnp.sum(weights_BT * loss_BT), (values_BT, clipped_BT)


def _minibatch_grads(params, graphdef, mb: ValueBatch, s: ValueUpdateSettings, frozen=None):
  """(gradient, stats) of one minibatch's value loss, accumulated over micro-batches."""
  weights_BT = mb.response_mask / jnp.maximum(mb.response_mask.sum(), 1)
  grad_fn = jax.value_and_grad(functools.partial(_minibatch_loss, frozen=frozen),
                               has_aux=True)
  k = micro_batches.num_micro_batches(mb.tokens.shape[0], s.micro_batch_size, "the minibatch")
  if k == 1:
    (loss, (values_BT, clipped_BT)), grads = grad_fn(params, graphdef, mb, weights_BT, s)
  else:
    def accumulate(carry, micro):
      grads, loss = carry
      (micro_loss, aux), micro_grads = grad_fn(params, graphdef, *micro, s)
      return (jax.tree.map(jnp.add, grads, micro_grads), loss + micro_loss), aux

    carry = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32))
    micro = micro_batches.split_micro((mb.replace(shuffle_rng=None), weights_BT), k)
    (grads, loss), aux = jax.lax.scan(accumulate, carry, micro)
    values_BT, clipped_BT = micro_batches.merge_micro(aux)
  valid_BT = mb.response_mask
  count = jnp.maximum(valid_BT.sum(), 1)
  mean = lambda x_BT: jnp.where(valid_BT, x_BT, 0.0).sum() / count
  residual_var = mean(jnp.square(mb.returns - values_BT)) - jnp.square(
      mean(mb.returns - values_BT))
  returns_var = mean(jnp.square(mb.returns)) - jnp.square(mean(mb.returns))
  stats = {"value_loss": loss, "value_clip_fraction": mean(clipped_BT.astype(jnp.float32)),
           "value_mean": mean(jax.lax.stop_gradient(values_BT)),
           "returns_mean": mean(mb.returns),
           # 1 - Var(R - V) / Var(R): 1 when the values predict the returns exactly; 0
           # when the returns do not vary (nothing to explain).
           "value_explained_variance": jnp.where(
               returns_var > 1e-8, 1.0 - residual_var / jnp.maximum(returns_var, 1e-8), 0.0)}
  return grads, stats


@functools.partial(jax.jit, static_argnames=("graphdef", "tx", "settings"),
                   donate_argnames=("params", "opt_state"))
def critic_step(graphdef, params, opt_state, batch: ValueBatch, *,
                tx: optax.GradientTransformation, settings: ValueUpdateSettings, frozen=None):
  """num_epochs x num_minibatches critic updates. Returns (params, opt_state, stats).
  `frozen`: the policy's trunk when the head sits on it (read, not donated)."""
  def one_update(carry, mb):
    params, opt_state = carry
    grads, stats = _minibatch_grads(params, graphdef, mb, settings, frozen)
    updates, opt_state = tx.update(grads, opt_state, params)
    stats["value_grad_norm"] = optax.tree.norm(grads)
    return (optax.apply_updates(params, updates), opt_state), stats

  def one_epoch(carry, rng):
    mbs = update.split_minibatches(batch, settings.num_minibatches, settings.group_size, rng)
    return jax.lax.scan(one_update, carry, mbs)

  rngs = jax.random.split(batch.shuffle_rng, settings.num_epochs)
  (params, opt_state), stats = jax.lax.scan(one_epoch, (params, opt_state), rngs)
  return params, opt_state, jax.tree.map(jnp.mean, stats)


@dataclasses.dataclass(frozen=True)
class Targets:
  """What one step's critic pass gives the policy update and its own."""
  advantages: jax.Array  # [B, T] whitened GAE advantages
  batch: ValueBatch      # the regression batch (its shuffle key set at the update)


@dataclasses.dataclass
class Critic:
  """The value model being trained beside the policy; mutated by `update`."""
  graphdef: Any
  params: Any
  opt_state: Any
  tx: optax.GradientTransformation
  settings: ValueUpdateSettings  # prompt_len set per step
  gamma: float                   # GAE's discount and lambda (`rl.gamma`, `rl.gae_lambda`)
  gae_lambda: float

  def targets(self, batch: update.TrainBatch, prompt_len: int, policy_params=None) -> Targets:
    """Values before the update, then GAE advantages and returns of `batch`'s rollouts.
    `policy_params`: the policy's state, read as the trunk when the head sits on it."""
    old_values_BT = values(self.graphdef, self.params, batch.tokens, batch.mask,
                           prompt_len=prompt_len,
                           micro_batch_size=self.settings.micro_batch_size,
                           frozen=self.trunk(policy_params))
    adv_BT, returns_BT = advantages(batch.rewards, old_values_BT, batch.response_mask,
                                    gamma=float(self.gamma), lam=float(self.gae_lambda))
    return Targets(adv_BT, ValueBatch(batch.tokens, batch.mask, batch.response_mask,
                                      old_values_BT, returns_BT, shuffle_rng=None))

  def update(self, targets: Targets, shuffle_rng: jax.Array, prompt_len: int,
             policy_params=None) -> dict[str, jax.Array]:
    """One `critic_step` on the step's returns; its stats (`value_loss`, ...)."""
    settings = dataclasses.replace(self.settings, prompt_len=prompt_len)
    self.params, self.opt_state, stats = critic_step(
        self.graphdef, self.params, self.opt_state,
        targets.batch.replace(shuffle_rng=shuffle_rng), tx=self.tx, settings=settings,
        frozen=self.trunk(policy_params))
    return stats

  @property
  def shares_policy_trunk(self) -> bool:
    return "trunk" not in self.params

  def trunk(self, policy_params):
    """The frozen trunk to merge with the head: the policy's (`critic.trunk="policy"`),
    else None (the critic's params hold their own trunk)."""
    if not self.shares_policy_trunk:
      return None
    if policy_params is None:
      raise ValueError("a critic on the policy's trunk needs the policy's parameters")
    return policy_trunk(policy_params)

  def checkpoint_tree(self) -> dict[str, Any]:
    return {"params": self.params, "opt_state": self.opt_state}


def create(critic: rl_settings.CriticSettings, rl: rl_settings.RLSettings,
           optim: rl_settings.OptimSettings, model: model_settings.ModelSettings, *,
           group_size: int, warmup_steps: int, mesh, policy_graphdef, policy_params) -> Critic:
  """The critic of a run with `rl.advantage=gae` training on `group_size` (m) rollouts per
  problem and warming up over the policy's `warmup_steps`, its optimizer state placed on
  `mesh`."""
  graphdef, params = build(critic, model, mesh, policy_graphdef, policy_params)
  tx = make_optimizer(critic, optim, warmup_steps=warmup_steps,
                      updates_per_step=rl.updates_per_step)
  return Critic(graphdef, params, init_optimizer(tx, params, mesh, critic.train_trunk), tx,
                settings=ValueUpdateSettings.derive(critic, rl, group_size=group_size),
                gamma=rl.gamma, gae_lambda=rl.gae_lambda)
