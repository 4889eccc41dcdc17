"""PODS: generate n rollouts per problem, update on a selected m of them.

Sampling is cheap to parallelise and the update is not, so PODS decouples the two:
`select_rollouts` picks m of each group's n rollouts and `gather_groups` pulls the
matching tokens, rewards and log-probs. Selection rules are registered by name
(`config.rl.downsampling`):

  max_variance  the m-subset whose rewards have the largest variance (PODS)
  max_reward    the m highest rewards
  random        a uniformly random m-subset

Max-variance in O(n log n): a subset of maximal variance is always the top k plus the
bottom m - k rewards for some k in 0..m (PODS, Lemma 1), so sort each group once and
score the m + 1 candidates with prefix sums of r and r^2. All groups are handled at
once; only array shapes depend on n and m, which are static.

Returned indices are sorted ascending within each group, so the selected rollouts keep
their original order.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np


def _check_m(rewards_GN: jax.Array, m: int) -> None:
  if rewards_GN.ndim != 2:
    raise ValueError(f"rewards_GN has shape {rewards_GN.shape}: expected [G, N]")
  n = rewards_GN.shape[1]
  if isinstance(m, bool) or not isinstance(m, (int, np.integer)):
    raise ValueError(f"m={m!r}: expected a Python int (rollouts kept per group)")
  if not 1 <= m <= n:
    raise ValueError(
        f"cannot keep m={m} of n={n} rollouts per group: expected 1 <= m <= n")


@functools.partial(jax.jit, static_argnames=("m",))
def max_variance(rewards_GN: jax.Array, m: int, *, rng: jax.Array | None = None) -> jax.Array:
  """Indices [G, m] of a maximum-variance m-subset of each group."""
  del rng
  n = rewards_GN.shape[1]
  r_GN = rewards_GN.astype(jnp.float32)
  # Variance is shift-invariant; centring keeps the prefix-sum formula accurate.
  r_GN = r_GN - r_GN.mean(axis=1, keepdims=True)
  order_GN = jnp.argsort(r_GN, axis=1)
  sorted_GN = jnp.take_along_axis(r_GN, order_GN, axis=1)
  zeros_G1 = jnp.zeros_like(sorted_GN[:, :1])
  # Prefix sums [G, N + 1] of the sorted rewards and of their squares.
  sums = jnp.concatenate([zeros_G1, jnp.cumsum(sorted_GN, axis=1)], axis=1)
  squares = jnp.concatenate([zeros_G1, jnp.cumsum(sorted_GN**2, axis=1)], axis=1)

  k_A = np.arange(m + 1)  # candidates: top k plus bottom m - k, A = m + 1
  # Top k = sorted[n - k:], bottom m - k = sorted[:m - k]; they never overlap (m <= n).
  s_GA = sums[:, n:] - sums[:, n - k_A] + sums[:, m - k_A]
  ss_GA = squares[:, n:] - squares[:, n - k_A] + squares[:, m - k_A]
  var_GA = ss_GA / m - (s_GA / m) ** 2
  best_k_G1 = jnp.argmax(var_GA, axis=1)[:, None]

  j_1M = np.arange(m)[None, :]
  sorted_pos_GM = jnp.where(j_1M < m - best_k_G1, j_1M, n - m + j_1M)
  indices_GM = jnp.take_along_axis(order_GN, sorted_pos_GM, axis=1)
  return jnp.sort(indices_GM, axis=1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("m",))
def max_reward(rewards_GN: jax.Array, m: int, *, rng: jax.Array | None = None) -> jax.Array:
  """Indices [G, m] of the m highest rewards (ties: lower index first)."""
  del rng
  _, indices_GM = jax.lax.top_k(rewards_GN.astype(jnp.float32), m)
  return jnp.sort(indices_GM, axis=1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("m",))
def random_subset(rewards_GN: jax.Array, m: int, *, rng: jax.Array | None = None) -> jax.Array:
  """Indices [G, m] of a uniformly random m-subset per group (needs `rng`)."""
  if rng is None:
    raise ValueError("downsampling 'random' needs rng (a jax.random key)")
  keys_GN = jax.random.uniform(rng, rewards_GN.shape)
  _, indices_GM = jax.lax.top_k(keys_GN, m)
  return jnp.sort(indices_GM, axis=1).astype(jnp.int32)


DOWNSAMPLERS: dict[str, Callable[..., jax.Array]] = {
    "max_variance": max_variance,
    "max_reward": max_reward,
    "random": random_subset,
}


def select_rollouts(name: str, rewards_GN: jax.Array, m: int, *,
                    rng: jax.Array | None = None) -> jax.Array:
  """int32 indices [G, m] into the N rollouts of each group, ascending per group.

  `m` must be a static Python int with 1 <= m <= N.
  """
  if name not in DOWNSAMPLERS:
    raise ValueError(f"downsampler {name!r}: expected one of {sorted(DOWNSAMPLERS)}")
  rewards_GN = jnp.asarray(rewards_GN)
  _check_m(rewards_GN, m)
  return DOWNSAMPLERS[name](rewards_GN, int(m), rng=rng)


def gather_groups(*arrays_GN: jax.Array, indices_GM: jax.Array | None = None):
  """Selects rollouts: each x [G, N, ...] -> [G, M, ...] by indices_GM [G, M].

  Call as gather_groups(x_GN, y_GNT, indices_GM) or with indices_GM= as a keyword.
  Returns one array for one input, else a tuple in input order.
  """
  if indices_GM is None:
    if len(arrays_GN) < 2:
      raise TypeError("gather_groups needs at least one array and indices_GM")
    *arrays_GN, indices_GM = arrays_GN
  if not arrays_GN:
    raise TypeError("gather_groups needs at least one array to gather")
  indices_GM = jnp.asarray(indices_GM)
  if indices_GM.ndim != 2:
    raise ValueError(f"indices_GM has shape {indices_GM.shape}: expected [G, M]")
  out = []
  for i, x in enumerate(arrays_GN):
    x = jnp.asarray(x)
    if x.ndim < 2 or x.shape[0] != indices_GM.shape[0]:
      raise ValueError(
          f"array {i} has shape {x.shape}: expected [G={indices_GM.shape[0]}, N, ...]")
    idx = indices_GM.reshape(indices_GM.shape + (1,) * (x.ndim - 2))
    out.append(jnp.take_along_axis(x, idx, axis=1))
  return out[0] if len(out) == 1 else tuple(out)
