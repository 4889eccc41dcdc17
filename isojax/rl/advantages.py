"""Advantage estimators: outcome rewards per group -> one advantage per rollout.

The RL recipes isojax implements differ mainly in how they turn a
group of n outcome rewards for the same problem into advantages. Each estimator is a
small pure function of `rewards_GN` (G problems, N rollouts each), registered by the
name a config uses (`config.rl.advantage`), so the update step never branches on
recipes and every estimator is tested against a NumPy formula.

  grpo        (r - mean_g) / (std_g + eps)          std_g: population std (ddof=0)
  drgrpo      r - mean_g                             Dr.GRPO: no std division
  batch_norm  (r - mean_g) / (std_B(r - mean_g) + eps)   ScaleRL batch-level norm
  rloo        r_i - mean_{j != i} r_j                leave-one-out baseline

The population std (ddof=0) matches the GRPO and ScaleRL reference code; with 0/1
rewards it makes a half-solved group's advantages exactly +-1.

Groups of unequal size (per-problem allocation: problem g has n_g rollouts) come as
`rewards_GN` padded to the largest group with `valid_GN` marking the real entries;
every statistic above is then taken over a group's own n_g rewards (the batch std over
all real ones), and padding gets advantage 0. Without `valid_GN` the computation is
exactly the equal-group one.

The IsoCompute paper's decoupled baseline (baseline from all n rollouts, update on m of
them) is `gather_groups(compute_advantages(name, rewards_GN), indices_GM)` with
`isojax.rl.downsampling`; computing advantages on the selected subset instead is the
PODS default.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

AdvantageFn = Callable[..., jax.Array]


def _as_float(rewards_GN: jax.Array) -> jax.Array:
  rewards_GN = jnp.asarray(rewards_GN)
  if rewards_GN.ndim != 2:
    raise ValueError(
        f"rewards_GN has shape {rewards_GN.shape}: expected [G, N] "
        "(problems, rollouts per problem)")
  return rewards_GN.astype(jnp.float32)


def _valid(valid_GN, r_GN: jax.Array) -> jax.Array | None:
  if valid_GN is None:
    return None
  valid_GN = jnp.asarray(valid_GN, bool)
  if valid_GN.shape != r_GN.shape:
    raise ValueError(f"valid_GN has shape {valid_GN.shape}: expected rewards' {r_GN.shape}")
  return valid_GN


def _constant_groups(r_GN: jax.Array, valid_GN: jax.Array | None) -> jax.Array:
  """[G, 1] bool: every (real) reward of the group equal to its first real one."""
  if valid_GN is None:
    return jnp.all(r_GN == r_GN[:, :1], axis=1, keepdims=True)
  first_G1 = jnp.take_along_axis(r_GN, jnp.argmax(valid_GN, axis=1)[:, None], axis=1)
  return jnp.all((r_GN == first_G1) | ~valid_GN, axis=1, keepdims=True)


def _centre(r_GN: jax.Array, valid_GN: jax.Array | None = None) -> jax.Array:
  """r - mean_g, exactly 0 in groups whose rewards are all equal: float rounding of
  the mean would otherwise leave ~1e-8 residues that the std division blows up."""
  constant_G1 = _constant_groups(r_GN, valid_GN)
  if valid_GN is None:
    return jnp.where(constant_G1, 0.0, r_GN - r_GN.mean(axis=1, keepdims=True))
  mean_G1 = r_GN.mean(axis=1, keepdims=True, where=valid_GN)
  return jnp.where(constant_G1 | ~valid_GN, 0.0, r_GN - mean_G1)


def grpo(rewards_GN: jax.Array, *, eps: float = 1e-6, valid_GN=None) -> jax.Array:
  """Group mean and population std (ddof=0) normalisation, [G, N] float32."""
  r_GN = _as_float(rewards_GN)
  valid_GN = _valid(valid_GN, r_GN)
  if valid_GN is None:
    return _centre(r_GN) / (r_GN.std(axis=1, keepdims=True) + eps)
  std_G1 = r_GN.std(axis=1, keepdims=True, where=valid_GN)
  return _centre(r_GN, valid_GN) / (std_G1 + eps)


def drgrpo(rewards_GN: jax.Array, *, eps: float = 1e-6, valid_GN=None) -> jax.Array:
  """Dr.GRPO: subtract the group mean only; dividing by the std biases towards
  too-easy and too-hard problems. `eps` is accepted for a uniform signature."""
  del eps
  r_GN = _as_float(rewards_GN)
  return _centre(r_GN, _valid(valid_GN, r_GN))


def batch_norm(rewards_GN: jax.Array, *, eps: float = 1e-6, valid_GN=None) -> jax.Array:
  """ScaleRL: centre within the group, then divide by the population std of the
  centred values over the whole batch (all G * N of them, or every real one).

  Groups with zero variance keep advantage 0 but still count in the batch std, as in
  ScaleRL's description; filter them out before this call to exclude them.
  """
  centred_GN = drgrpo(rewards_GN, valid_GN=valid_GN)
  if valid_GN is None:
    return centred_GN / (centred_GN.std() + eps)
  return centred_GN / (centred_GN.std(where=jnp.asarray(valid_GN, bool)) + eps)


def rloo(rewards_GN: jax.Array, *, eps: float = 1e-6, valid_GN=None) -> jax.Array:
  """REINFORCE leave-one-out: r_i minus the mean of the other N - 1 rewards.

  Equals N / (N - 1) * (r_i - mean_g); needs N >= 2 (with unequal groups, a group of
  one has no baseline and gets advantage 0).
  """
  del eps
  r_GN = _as_float(rewards_GN)
  valid_GN = _valid(valid_GN, r_GN)
  if valid_GN is None:
    n = r_GN.shape[1]
    if n < 2:
      raise ValueError(f"rloo needs at least 2 rollouts per group, got n={n}")
    # r_i - (sum - r_i) / (n - 1) = n / (n - 1) * (r_i - mean).
    return _centre(r_GN) * (n / (n - 1))
  n_G1 = valid_GN.sum(axis=1, keepdims=True).astype(jnp.float32)
  return _centre(r_GN, valid_GN) * (n_G1 / jnp.maximum(n_G1 - 1.0, 1.0))


ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {
    "grpo": grpo,
    "drgrpo": drgrpo,
    "batch_norm": batch_norm,
    "rloo": rloo,
}


def compute_advantages(name: str, rewards_GN: jax.Array, *, eps: float = 1e-6,
                       valid_GN=None) -> jax.Array:
  """Advantages [G, N] float32 from the estimator registered as `name` (with
  `valid_GN`, of groups of unequal size padded to N; 0 on the padding)."""
  if name not in ADVANTAGE_ESTIMATORS:
    raise ValueError(
        f"advantage estimator {name!r}: expected one of {sorted(ADVANTAGE_ESTIMATORS)}")
  if valid_GN is None:
    return ADVANTAGE_ESTIMATORS[name](rewards_GN, eps=eps)
  return ADVANTAGE_ESTIMATORS[name](rewards_GN, eps=eps, valid_GN=valid_GN)


def zero_variance_groups(rewards_GN: jax.Array, valid_GN=None) -> jax.Array:
  """[G] bool: True where every (real) reward of the group is equal (no learning
  signal)."""
  rewards_GN = jnp.asarray(rewards_GN)
  if rewards_GN.ndim != 2:
    raise ValueError(f"rewards_GN has shape {rewards_GN.shape}: expected [G, N]")
  return _constant_groups(rewards_GN, _valid(valid_GN, rewards_GN))[:, 0]


# --------------------------------------------------------------------------------
# Generalised advantage estimation (PPO with a critic, `rl.advantage=gae`): per token,
# from a value model's estimates; not a group estimator, so n = 1 is allowed.
# --------------------------------------------------------------------------------


def gae(rewards_B: jax.Array, values_BT: jax.Array, mask_BT: jax.Array, *, gamma: float,
        lam: float) -> tuple[jax.Array, jax.Array]:
  """(advantages [B, T], returns [B, T]) of outcome-rewarded responses, 0 off the mask.

  The reward of row b arrives on its last valid token; every other step earns 0 and
  the state after the last token is terminal (value 0). Over the valid tokens of a row
  t_0 < t_1 < ... (positions where mask is 0, padding or forced context, are skipped):
    delta_i = r_i + gamma * V(t_{i+1}) - V(t_i)
    A(t_i)  = delta_i + gamma * lam * A(t_{i+1}),   returns = A + V.
  """
  rewards_B = jnp.asarray(rewards_B, jnp.float32)
  values_BT = jnp.asarray(values_BT, jnp.float32)
  valid_BT = jnp.asarray(mask_BT, bool)
  if values_BT.shape != valid_BT.shape or rewards_B.shape != values_BT.shape[:1]:
    raise ValueError(f"rewards_B {rewards_B.shape}, values_BT {values_BT.shape} and mask_BT "
                     f"{valid_BT.shape}: expected [B], [B, T], [B, T]")
  values_BT = jnp.where(valid_BT, values_BT, 0.0)

  def back(carry, xs):  # from the last position to the first
    next_value_B, next_adv_B, seen_B = carry
    value_B, valid_B = xs
    reward_B = jnp.where(seen_B, 0.0, rewards_B)  # the row's last valid token: its reward
    delta_B = reward_B + gamma * next_value_B - value_B
    adv_B = delta_B + gamma * lam * next_adv_B
    carry = (jnp.where(valid_B, value_B, next_value_B), jnp.where(valid_B, adv_B, next_adv_B),
             seen_B | valid_B)
    return carry, jnp.where(valid_B, adv_B, 0.0)

  zeros_B = jnp.zeros_like(rewards_B)
  _, adv_TB = jax.lax.scan(back, (zeros_B, zeros_B, jnp.zeros(rewards_B.shape, bool)),
                           (values_BT.T, valid_BT.T), reverse=True)
  adv_BT = adv_TB.T
  return adv_BT, jnp.where(valid_BT, adv_BT + values_BT, 0.0)


def whiten(x_BT: jax.Array, mask_BT: jax.Array, *, eps: float = 1e-6) -> jax.Array:
  """(x - mean) / (std + eps) over the valid tokens of the batch; 0 off the mask."""
  valid_BT = jnp.asarray(mask_BT, bool)
  count = jnp.maximum(valid_BT.sum(), 1)
  mean = jnp.where(valid_BT, x_BT, 0.0).sum() / count
  var = jnp.where(valid_BT, jnp.square(x_BT - mean), 0.0).sum() / count
  return jnp.where(valid_BT, (x_BT - mean) / (jnp.sqrt(var) + eps), 0.0)
