"""Checkpoints of the train state: saved with a fingerprint, restored past damaged ones.

A checkpoint damaged on disk either fails inside orbax (a flipped byte in a compressed
block: "ZSTD_decompressStream() failed: Data corruption detected") or, when the damage
falls in bytes that zstd stored verbatim, restores wrong values without complaint: the
frames orbax writes carry no checksum. So `save` records a fingerprint of every array
beside them, and `restore_newest` treats a mismatch like an orbax error.

A checkpoint that fails is reported (step, directory, error) and, once an older one
restores, moved aside into `run_dir.corrupt_checkpoint_dir` (never deleted; orbax's
CheckpointManager does not look there), so the run continues from the older one and
`metrics.jsonl` is rewritten from its step. When no checkpoint restores, nothing is
moved and the run stops: every checkpoint failing at once is more likely a changed model
than damaged bytes, and the error lists each failure.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from isojax import metrics, run_dir

# The key of the saved JSON item (`counters`) that holds the arrays' fingerprints.
FINGERPRINTS = "fingerprints"
# The item of the rollouts sampled ahead of the update (off-policy runs only).
QUEUE = "queue"
# The saved item of PPO's value model: {"params": ..., "opt_state": ...}.
CRITIC = "critic"
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


class CorruptCheckpoint(ValueError):
  """Restored arrays whose fingerprint differs from the one saved with them."""


class NoRestorableCheckpoint(RuntimeError):
  """Checkpoints exist but none restores."""


@jax.jit
def _fingerprint(leaves: list[jax.Array]) -> jax.Array:
  total = jnp.uint32(0)
  for i, x in enumerate(leaves):
    if x.dtype == jnp.bool_:
      x = x.astype(jnp.uint8)
    bits = jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize]).astype(jnp.uint32)
    # Odd weights are invertible modulo 2**32: any change to one leaf changes the total.
    total += jnp.sum(bits, dtype=jnp.uint32) * jnp.uint32(2 * i + 1)
  return total


def fingerprint(tree: Any) -> int:
  """The bits of every array in `tree` summed modulo 2**32, leaf i weighted by 2i + 1.

  Integer sums are exact in any order, so it does not depend on how the arrays are
  sharded; changing one word of one array always changes it.
  """
  return int(_fingerprint(jax.tree.leaves(tree)))


def manager(directory: epath.PathLike, keep: int) -> ocp.CheckpointManager:
  """Synchronous saves; the newest `keep` checkpoints are kept (config checkpoint_keep)."""
  return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
      max_to_keep=keep, enable_async_checkpointing=False))


def save(ckpt: ocp.CheckpointManager, step: int, *, params: Any, opt_state: Any,
         counters: dict[str, Any], queue: dict[str, Any] | None = None,
         critic: Any = None) -> None:
  """Saves the arrays, and `counters` (JSON) with the arrays' fingerprints added.

  `queue` (a tree of NumPy arrays, `off_policy.queue_tree`) holds the batches sampled
  ahead of the update; it is saved, and fingerprinted, when it is not empty. `critic`
  (PPO's value model and its optimizer state, `rl.critic`) likewise when given.
  """
  trees = dict(params=params, opt_state=opt_state, **({QUEUE: queue} if queue else {}),
               **({CRITIC: critic} if critic is not None else {}))
  counters = dict(counters, **{FINGERPRINTS: {k: fingerprint(v) for k, v in trees.items()}})
  ckpt.save(step, args=ocp.args.Composite(
      **{k: ocp.args.StandardSave(v) for k, v in trees.items()},
      counters=ocp.args.JsonSave(counters)), force=True)


@dataclasses.dataclass(frozen=True)
class Failure:
  """A checkpoint that did not restore."""
  step: int
  path: str           # its directory when it failed
  error: str          # the innermost error, which names the file orbax could not read
  moved_to: str = ""  # where it was moved aside ("" when it was not)

  def event(self) -> dict[str, Any]:
    """Its metrics.jsonl event fields (the caller adds step, rollouts, tokens, wall_s)."""
    return {run_dir.EVENT: metrics.EVENT_CHECKPOINT_CORRUPT, "corrupt_step": self.step,
            "path": self.path, "moved_to": self.moved_to, "error": self.error,
            "message": f"checkpoint step {self.step} ({self.path}) does not restore "
                       f"({self.error}); moved to {self.moved_to or '(not moved)'}"}


@dataclasses.dataclass(frozen=True)
class Restored:
  step: int
  params: Any
  opt_state: Any
  counters: dict[str, Any]       # the JSON saved with them, fingerprints removed
  corrupt: tuple[Failure, ...]   # newer checkpoints that failed, now moved aside
  queue: dict[str, Any] | None = None  # the batches sampled ahead (off-policy runs)
  critic: Any = None                   # the value model's state (PPO with a critic)


def _describe(error: BaseException) -> str:
  """The innermost cause's first line: orbax wraps tensorstore's error, which names the
  file, in one that only names the array's index."""
  while True:
    inner = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    if inner is None:
      break
    error = inner
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0] if lines else ''}"[:1000]


def _restore(ckpt: ocp.CheckpointManager, step: int, params: Any, opt_state: Any,
             critic: Any = None):
  items = dict(params=ocp.args.StandardRestore(params),
               opt_state=ocp.args.StandardRestore(opt_state), counters=ocp.args.JsonRestore())
  if critic is not None:
    items[CRITIC] = ocp.args.StandardRestore(critic)
  restored = ckpt.restore(step, args=ocp.args.Composite(**items))
  counters = dict(restored.counters)
  saved = counters.pop(FINGERPRINTS, None)  # None: saved before fingerprints existed
  trees = dict(params=restored.params, opt_state=restored.opt_state)
  if critic is not None:
    trees[CRITIC] = restored[CRITIC]
  if saved and QUEUE in saved:
    trees[QUEUE] = ckpt.restore(step, args=ocp.args.Composite(
        **{QUEUE: ocp.args.StandardRestore()}))[QUEUE]
  if saved is not None:
    found = {k: fingerprint(v) for k, v in trees.items()}
    wrong = [k for k in found if found[k] != saved.get(k)]
    if wrong:
      raise CorruptCheckpoint(
          "; ".join(f"{k}: fingerprint {found[k]}, saved {saved.get(k)}" for k in wrong))
  return trees, counters


def _move_aside(failure: Failure, corrupt_dir: epath.Path) -> Failure:
  corrupt_dir.mkdir(parents=True, exist_ok=True)
  target, n = corrupt_dir / str(failure.step), 1
  while target.exists():  # the same step corrupted again after an earlier fallback
    n += 1
    target = corrupt_dir / f"{failure.step}.{n}"
  epath.Path(failure.path).rename(target)
  logging.warning("moved checkpoint step %d aside to %s (not deleted)", failure.step, target)
  return dataclasses.replace(failure, moved_to=str(target))


def restore_newest(ckpt: ocp.CheckpointManager, *, params: Any, opt_state: Any,
                   corrupt_dir: epath.PathLike, primary: bool = True,
                   critic: Any = None) -> Restored | None:
  """The newest checkpoint that restores; None when there is none.

  `params`, `opt_state` (and `critic`, when the run has one) give the structure, shapes
  and shardings to restore into.
  Newer checkpoints that fail are moved into `corrupt_dir` (by the `primary` process)
  once an older one restores. Raises NoRestorableCheckpoint when none does.
  """
  failures = []
  for step in sorted(ckpt.all_steps(), reverse=True):
    try:
      trees, counters = _restore(ckpt, step, params, opt_state, critic)
    except Exception as e:  # pylint: disable=broad-except  # orbax raises bare Exception
      failures.append(Failure(step, str(epath.Path(ckpt.directory) / str(step)), _describe(e)))
      logging.error("checkpoint step %d (%s) does not restore: %s", step,
                    failures[-1].path, failures[-1].error)
      continue
    if failures:
      if primary:
        failures = [_move_aside(f, epath.Path(corrupt_dir)) for f in failures]
      if jax.process_count() > 1:  # every host sees them moved before it lists steps
        multihost_utils.sync_global_devices("isojax: corrupt checkpoints moved aside")
      ckpt.reload()
    return Restored(step, trees["params"], trees["opt_state"], counters, tuple(failures),
                    trees.get(QUEUE), trees.get(CRITIC))
  if failures:
    raise NoRestorableCheckpoint(
        f"no checkpoint in {ckpt.directory} restores (nothing was moved; if the model or "
        "optimizer config changed, use a new --workdir): " +
        "; ".join(f"step {f.step}: {f.error}" for f in failures))
  return None
