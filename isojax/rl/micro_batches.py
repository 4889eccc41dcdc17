"""Splitting a batch's rows into micro-batches (gradient accumulation, log-prob passes),
and the order and cuts of `rl.length_buckets`: rows sorted by response length so that
each micro-batch can run cut to its longest response.

`update` and `critic` share these; each pass's numbers do not depend on the split (to
float rounding), only its memory and compute do.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from isojax.models import sharding


def num_micro_batches(rows: int, micro_batch_size: int, what: str, why: str = "") -> int:
  """How many micro-batches of `micro_batch_size` rollouts cover `rows` rollouts.

  0, or a size of at least `rows`, means one pass over all of them: the setting caps
  the rollouts per pass, so a cap above the minibatch is no error.
  """
  if micro_batch_size < 0:
    raise ValueError(f"rl.micro_batch_size={micro_batch_size}: expected >= 0 "
                     "(0 = the whole minibatch)")
  if not micro_batch_size or micro_batch_size >= rows:
    return 1
  if rows % micro_batch_size:
    raise ValueError(f"rl.micro_batch_size={micro_batch_size} must divide {what} of "
                     f"{rows} rollouts{why}")
  return rows // micro_batch_size


def split_micro(tree, k: int):
  """[B, ...] -> [k, B / k, ...]; micro-batch j holds rows j, j + k, j + 2k, ...

  Strided rather than contiguous: the reshape keeps the data-parallel sharding of the
  batch axis on every micro-batch, where a contiguous block would sit on few devices.
  """
  return jax.tree.map(lambda x: rows_on_batch(
      x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1), axis=1), tree)


def rows_on_batch(x: jax.Array, axis: int) -> jax.Array:
  """`x` with dimension `axis` (rollouts) split over the data-parallel mesh axes.

  Gathers and reshapes of the batch axis (minibatch shuffles, micro-batches) lose its
  sharding; without this, every device would compute every row of a micro-batch.
  """
  names = [None] * x.ndim
  names[axis] = "batch"
  return sharding.constrain(x, tuple(names))


def merge_micro(tree):
  """Inverse of `split_micro`: [k, B / k, ...] -> [B, ...] in the original row order."""
  return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), tree)


def response_buckets(t: int, halvings: int) -> tuple[int, ...]:
  """The response lengths a micro-batch may be cut to, ascending: ceil(t / 2^j) for j in
  0..halvings (distinct)."""
  return tuple(sorted({-(-t // 2 ** j) for j in range(halvings + 1)}))


def length_order(mask_BS: jax.Array, k: int, prompt_len: int) -> jax.Array:
  """A row order [B] that, split by `split_micro` into k micro-batches, gives micro-batch
  j the j-th block of B / k rows by ascending response length (real tokens of `mask_BS`
  after the prompt; a response is a prefix of its slots)."""
  by_length = jnp.argsort(mask_BS[:, prompt_len:].sum(axis=1), stable=True)
  return by_length.reshape(k, -1).T.reshape(-1)
