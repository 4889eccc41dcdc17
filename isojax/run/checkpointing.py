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

Beside the newest `checkpoint_keep`, the checkpoints in a `KeptSteps` are kept: the
guard's last healthy one from before a collapse (`train`). A rerun may go back to an
older checkpoint (`restore_newest(step=...)`); the newer ones are then moved aside into
`run_dir.superseded_checkpoint_dir`, never deleted.

A save that finds the disk full raises `storage.NoSpace` naming the checkpoint, the
bytes its arrays need and the bytes free; its partial directory is removed and the
checkpoints before it are left whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from jax.experimental import multihost_utils

from isojax import metrics, run_dir, storage

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


@dataclasses.dataclass
class KeptSteps(ocp.checkpoint_managers.PreservationPolicy):
  """Checkpoints kept whatever their age: an orbax preservation policy whose `steps` the
  caller changes as the run goes (orbax asks it after every save)."""
  steps: set[int] = dataclasses.field(default_factory=set)

  def should_preserve(self, checkpoints: Sequence[Any], *, context: Any) -> list[bool]:
    del context
    return [info.step in self.steps for info in checkpoints]


def manager(directory: epath.PathLike, keep: int,
            kept: KeptSteps | None = None) -> ocp.CheckpointManager:
  """Synchronous saves; the newest `keep` checkpoints are kept (config checkpoint_keep),
  and those in `kept`."""
  policy = ocp.checkpoint_managers.AnyPreservationPolicy(
      [ocp.checkpoint_managers.LatestN(n=keep), kept or KeptSteps()])
  return ocp.CheckpointManager(directory, options=ocp.CheckpointManagerOptions(
      preservation_policy=policy, enable_async_checkpointing=False))


def newest_at_or_before(ckpt: ocp.CheckpointManager, step: int) -> int | None:
  """The newest checkpoint step <= `step`, or None."""
  steps = [s for s in ckpt.all_steps() if s <= step]
  return max(steps) if steps else None


def check_step(ckpt: ocp.CheckpointManager, step: int | None) -> None:
  """Raises ValueError naming the checkpoints there are when `step` is not one of them."""
  if step is not None and step not in ckpt.all_steps():
    raise ValueError(f"--resume_step={step}: {ckpt.directory} has no checkpoint at that step "
                     f"(it has {sorted(ckpt.all_steps()) or 'none'})")


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
  try:
    with _late_writes_quiet():
      ckpt.save(step, args=ocp.args.Composite(
          **{k: ocp.args.StandardSave(v) for k, v in trees.items()},
          counters=ocp.args.JsonSave(counters)), force=True)
  except Exception as e:  # pylint: disable=broad-except  # tensorstore raises ValueError
    if not storage.is_no_space(e):
      raise
    raise _no_space(ckpt, step, sum(x.nbytes for x in jax.tree.leaves(trees))) from e


@contextlib.contextmanager
def _late_writes_quiet() -> Iterator[None]:
  """When one tensorstore write fails, orbax closes its asyncio loop; the writes still in
  flight then complete into the closed loop, each printing "RuntimeError: Event loop is
  closed" as an unraisable exception. Those are held during the save: passed on if it
  succeeds or fails otherwise, dropped for the rest of the run (which ends with
  `storage.NoSpace`) if it found the disk full."""
  previous, held = sys.unraisablehook, []

  def hook(unraisable) -> None:
    if (isinstance(unraisable.exc_value, RuntimeError)
        and str(unraisable.exc_value) == "Event loop is closed"):
      held.append(unraisable)
    else:
      previous(unraisable)

  sys.unraisablehook, full = hook, False
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    full = storage.is_no_space(e)
    raise
  finally:
    if not full:
      sys.unraisablehook = previous
      for unraisable in held:
        previous(unraisable)


def _no_space(ckpt: ocp.CheckpointManager, step: int, needed: int) -> storage.NoSpace:
  """The error of a save that filled the disk, once its partial directory is removed."""
  directory = epath.Path(ckpt.directory)
  if jax.process_index() == 0:
    for partial in directory.glob(f"{step}{run_dir.PARTIAL_CHECKPOINT}*"):
      try:
        partial.rmtree()
      except OSError as e:  # what it could not remove stays: orbax ignores tmp directories
        logging.warning("could not remove the partial checkpoint %s: %s", partial, e)
  ckpt.reload()
  last = ckpt.latest_step()
  free = storage.free_bytes(directory)
  return storage.NoSpace(
      f"no space left on device saving checkpoint step {step} to {directory / str(step)}: "
      f"it needs up to {needed:,} bytes (its arrays, before compression)"
      f"{f', {free:,} are free there' if free is not None else ''}; the partial checkpoint "
      "was removed and "
      + (f"step {last}, the newest whole one, is where a rerun resumes once there is room"
         if last is not None else "no checkpoint was saved yet: a rerun starts afresh"))


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
  superseded: tuple[int, ...] = ()     # newer steps moved aside: a rerun went back to `step`


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
  target = _move(epath.Path(failure.path), failure.step, corrupt_dir)
  return dataclasses.replace(failure, moved_to=str(target))


def _move(source: epath.Path, step: int, into: epath.Path) -> epath.Path:
  into.mkdir(parents=True, exist_ok=True)
  target, n = into / str(step), 1
  while target.exists():  # the same step moved aside before
    n += 1
    target = into / f"{step}.{n}"
  source.rename(target)
  logging.warning("moved checkpoint step %d aside to %s (not deleted)", step, target)
  return target


def restore_newest(ckpt: ocp.CheckpointManager, *, params: Any, opt_state: Any,
                   corrupt_dir: epath.PathLike, primary: bool = True,
                   critic: Any = None, step: int | None = None,
                   superseded_dir: epath.PathLike | None = None) -> Restored | None:
  """The newest checkpoint that restores; None when there is none.

  `params`, `opt_state` (and `critic`, when the run has one) give the structure, shapes
  and shardings to restore into.
  Newer checkpoints that fail are moved into `corrupt_dir` (by the `primary` process)
  once an older one restores. Raises NoRestorableCheckpoint when none does.
  With `step` (`check_step` first), that checkpoint or none: once it restores, the newer
  ones are moved into `superseded_dir`.
  """
  if step is not None:
    newer = [s for s in ckpt.all_steps() if s > step]
    restored = _restore_from(ckpt, [step], params, opt_state, critic, corrupt_dir, primary)
    if primary:
      for s in sorted(newer):
        _move(epath.Path(ckpt.directory) / str(s), s, epath.Path(superseded_dir))
    _reload_everywhere(ckpt, "isojax: superseded checkpoints moved aside")
    return dataclasses.replace(restored, superseded=tuple(sorted(newer)))
  return _restore_from(ckpt, sorted(ckpt.all_steps(), reverse=True), params, opt_state,
                       critic, corrupt_dir, primary)


def _reload_everywhere(ckpt: ocp.CheckpointManager, what: str) -> None:
  if jax.process_count() > 1:  # every host sees them moved before it lists steps
    multihost_utils.sync_global_devices(what)
  ckpt.reload()


def _restore_from(ckpt: ocp.CheckpointManager, steps: list[int], params: Any, opt_state: Any,
                  critic: Any, corrupt_dir: epath.PathLike, primary: bool) -> Restored | None:
  """The first of `steps` that restores (the failed ones before it moved aside)."""
  failures = []
  for step in steps:
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
      _reload_everywhere(ckpt, "isojax: corrupt checkpoints moved aside")
    return Restored(step, trees["params"], trees["opt_state"], counters, tuple(failures),
                    trees.get(QUEUE), trees.get(CRITIC))
  if failures:
    raise NoRestorableCheckpoint(
        f"no checkpoint in {ckpt.directory} restores (nothing was moved; if the model or "
        "optimizer config changed, use a new --workdir): " +
        "; ".join(f"step {f.step}: {f.error}" for f in failures))
  return None
