"""The policy's (and the critic's) optimizer: clipped AdamW behind a linear warm-up, the
parameters `optim.frozen` names held fixed, and its state placed beside the parameters.

Kept apart from the update (`rl/update.py`), which only applies what this builds: the
run, the critic, `launch.aot` and the benches construct the same transformation here.
"""

from __future__ import annotations

import jax
import optax

from isojax.rl import settings as rl_settings


def make_optimizer(optim: rl_settings.OptimSettings, *, peak_learning_rate: float,
                   warmup_steps: int, updates_per_step: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with a linear warm-up over `warmup_steps` RL steps (the run's:
  `RunSettings.warmup_steps`) then constant LR at `peak_learning_rate` (the run's, scaled
  with the rollout batch: `RunSettings.learning_rate`); the parameters under
  `optim.frozen` get no update."""
  schedule = warmup_schedule(peak_learning_rate, warmup_steps * updates_per_step)
  if not optim.frozen:
    return adamw(optim, schedule), schedule
  frozen = frozen_mask(optim.frozen)
  # Their gradients are zeroed first, so they add nothing to the clipped norm and Adam's
  # moments stay zero (its update of a zero moment is zero); no weight decay either.
  # optax.multi_transform would drop their moments, but its masked state is not
  # parameter-shaped, which opt_state_shardings needs to place the moments.
  trainable = lambda params: jax.tree.map(lambda f: not f, frozen(params))
  return optax.chain(optax.masked(optax.set_to_zero(), frozen),
                     adamw(optim, schedule, decay_mask=trainable)), schedule


def adamw(optim: rl_settings.OptimSettings, schedule: optax.Schedule,
          decay_mask=None) -> optax.GradientTransformation:
  """`optim`'s clipped AdamW at `schedule` (the policy's, and the critic's at its own LR),
  decaying the parameters `decay_mask` marks (all when None)."""
  return optax.chain(
      optax.clip_by_global_norm(optim.grad_clip_norm) if optim.grad_clip_norm
      else optax.identity(),
      optax.adamw(schedule, b1=optim.b1, b2=optim.b2, weight_decay=optim.weight_decay,
                  mask=decay_mask))


def parameter_path(path) -> str:
  """`embed/embedding` for a parameter's pytree key path (nnx's `value` key left out)."""
  names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
  return "/".join(n for n in names if n != "value")


def frozen_mask(prefixes: tuple[str, ...]):
  """params -> a pytree of bools: True under one of `prefixes` (`optim.frozen`); a prefix
  that matches no parameter is an error naming it and the parameters there are."""
  def under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")

  def mask(params):
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = [parameter_path(p) for p, _ in leaves]
    unmatched = [p for p in prefixes if not any(under(path, p) for path in paths)]
    if unmatched:
      raise ValueError(f"optim.frozen: {unmatched} match no trained parameter; the trained "
                       f"parameters are {paths}")
    return jax.tree_util.tree_unflatten(
        treedef, [any(under(path, p) for p in prefixes) for path in paths])
  return mask


def warmup_schedule(peak: float, warmup_updates: int) -> optax.Schedule:
  """Linear from 0 to `peak` over `warmup_updates` optimizer updates (the warm-up's
  RL steps of `RLSettings.updates_per_step` each), then constant; 0 is `peak` from the
  first update on."""
  if not warmup_updates:
    return optax.constant_schedule(peak)
  return optax.warmup_constant_schedule(0.0, peak, warmup_updates)


def opt_state_shardings(tx: optax.GradientTransformation, params, mesh):
  """Where `tx.init(params)` should live: each parameter's moments beside the parameter.

  `jax.jit(tx.init)` alone leaves the state on one device (zeros carry no sharding),
  and the first update would then replicate Adam's moments on every chip.
  `params` holds arrays or `jax.ShapeDtypeStruct`s with shardings; step counts and
  other non-parameter fields are replicated.
  """
  return optax.tree_utils.tree_map_params(
      tx, lambda _, x: x.sharding, jax.eval_shape(tx.init, params), params,
      transform_non_params=lambda _: jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))


def init_optimizer(tx: optax.GradientTransformation, params, shardings, *,
                   abstract: bool = False):
  """`tx.init(params)` placed by `shardings` (a tree, or one Sharding for every leaf).

  With `abstract` the parameters are `jax.ShapeDtypeStruct`s and so is the result,
  placed the same way: what `launch.aot` compiles against, nothing allocated.
  """
  if not abstract:
    return jax.jit(tx.init, out_shardings=shardings)(params)
  state = jax.eval_shape(tx.init, params)
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, state)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      state, shardings)
