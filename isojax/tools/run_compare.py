"""Whether two run directories hold the same numbers, bit for bit, and where they part.

A change that should leave every number as it was (a refactor) is checked by running
the same configs before and after it on the same machine and comparing the run
directories (`isojax.tools.identical_runs` does the running). Two runs of the same code on
the same machine agree exactly except in what measures time, so everything else is
compared exactly:

  metrics.jsonl   line by line, each value by its JSON text (so NaN equals NaN and
                  -0.0 differs from 0.0), wall-clock and memory fields removed
                  (`run_dir.without_timings`)
  config.json     field by field
  layout          the names of the files and directories (`layout`), not their contents
  checkpoints     every array of every item of every saved step, by its bytes, and the
                  JSON items (the counters) without their wall-clock fields; the
                  wall-clock arrays of queued batches (`TIMING_ARRAYS`) left out

Each comparison returns the first `Difference` it finds, which names the step and field
or the array's path, so a broken refactor points at the first number it changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import os
from typing import Any, Iterator

import jax
import numpy as np
import orbax.checkpoint as ocp

from isojax import run_dir, storage
from isojax.run import checkpointing

# TensorBoard names its event file by the time and the host that wrote it.
EVENT_FILE_PATTERN = "events.out.tfevents.*"
# Checkpoint arrays of wall-clock seconds, by their key: the sampling phases of each
# batch queued ahead of the update (`rl.off_policy.Generated.to_tree`). Left out, with
# the fingerprint saved for the item that holds them.
TIMING_ARRAYS = ("timings",)


@dataclasses.dataclass(frozen=True)
class Difference:
  """The first place where two runs differ."""
  part: str    # "metrics", "config", "layout" or "checkpoint"
  where: str   # "line 4 (step 3), train/loss", "checkpoints/3/params['embed']...", a path
  detail: str  # what each side holds there

  def __str__(self) -> str:
    return f"{self.part}: {self.where}: {self.detail}"


def _text(value: Any) -> str:
  """A JSON value as text: exact for floats, and NaN equal to itself."""
  return json.dumps(value, sort_keys=True, default=storage.json_default)


def _first_field(base: dict[str, Any], new: dict[str, Any]) -> str | None:
  """The first key (in base's order, then new's) whose value differs or one side lacks."""
  keys = list(base) + [k for k in new if k not in base]
  return next((k for k in keys
               if k not in base or k not in new or _text(base[k]) != _text(new[k])), None)


def _brief(text: str, limit: int = 80) -> str:
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _value_difference(base: dict[str, Any], new: dict[str, Any], key: str) -> tuple[str, str]:
  """(where, detail) of `key`, whose values differ: the first differing element of two
  lists of one length (the per-problem counts), else both values, shortened."""
  if key not in base or key not in new:
    return key, "only in " + ("base" if key in base else "new")
  b, n = base[key], new[key]
  if isinstance(b, list) and isinstance(n, list) and len(b) == len(n):
    i = next(i for i, (x, y) in enumerate(zip(b, n)) if _text(x) != _text(y))
    key, b, n = f"{key}[{i}]", b[i], n[i]
  return key, f"base {_brief(_text(b))}, new {_brief(_text(n))}"


def compare_metrics(base: list[dict[str, Any]], new: list[dict[str, Any]],
                    part: str = "metrics") -> Difference | None:
  """The first line and field where two runs' metrics lines differ, timings aside."""
  for i, (b, n) in enumerate(zip(base, new)):
    b, n = run_dir.without_timings(b), run_dir.without_timings(n)
    field = _first_field(b, n)
    if field is not None:
      step = b.get(run_dir.STEP, n.get(run_dir.STEP))
      where, detail = _value_difference(b, n, field)
      return Difference(part, f"line {i + 1} (step {step}), {where}", detail)
  if len(base) != len(new):
    return Difference(part, f"line {min(len(base), len(new)) + 1}",
                      f"base has {len(base)} lines, new has {len(new)}")
  return None


def _flatten_json(value: Any, prefix: str = "") -> dict[str, Any]:
  """{'a.b': 1} for {'a': {'b': 1}}: nested objects as dotted names."""
  if isinstance(value, dict) and value:
    out = {}
    for k, v in value.items():
      out.update(_flatten_json(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: value}


def compare_config(base: dict[str, Any], new: dict[str, Any]) -> Difference | None:
  """The first dotted config field that differs or that one side lacks."""
  b, n = _flatten_json(base), _flatten_json(new)
  field = _first_field(b, n)
  if field is None:
    return None
  where, detail = _value_difference(b, n, field)
  return Difference("config", f"{run_dir.CONFIG_FILE}: {where}", detail)


def layout(workdir: str) -> list[str]:
  """The relative paths of a run directory's files and directories, sorted.

  Below `checkpoints/<step>/<item>/` orbax names its data files by content, so the
  listing stops at the item (its arrays are compared by `compare_checkpoints`); the
  TensorBoard event file is listed as `EVENT_FILE_PATTERN`.
  """
  names = []
  for dirpath, dirnames, filenames in os.walk(workdir):
    rel = os.path.relpath(dirpath, workdir)
    parts = [] if rel == "." else rel.split(os.sep)
    if parts[:1] == [run_dir.CHECKPOINT_DIR] and len(parts) >= 3:
      dirnames[:] = []
      continue
    for name in dirnames + filenames:
      if fnmatch.fnmatch(name, EVENT_FILE_PATTERN):
        name = EVENT_FILE_PATTERN
      names.append("/".join(parts + [name]))
  return sorted(names)


def compare_layout(base: list[str], new: list[str]) -> Difference | None:
  """The paths that only one of two layouts has."""
  only_base, only_new = sorted(set(base) - set(new)), sorted(set(new) - set(base))
  if not only_base and not only_new:
    return None
  return Difference("layout", (only_base + only_new)[0],
                    f"only in base: {_names(only_base)}; only in new: {_names(only_new)}")


def _names(paths: list[str], shown: int = 4) -> str:
  if not paths:
    return "nothing"
  more = f" and {len(paths) - shown} more" if len(paths) > shown else ""
  return ", ".join(paths[:shown]) + more


class _QuietUnregisteredItems(logging.Filter):
  """Drops orbax's warning that an item restored without arguments has no registered
  handler: it then uses the handler recorded beside the item, which is what we want."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "was found in the checkpoint, but could not be restored" not in record.getMessage()


@contextlib.contextmanager
def _quiet_orbax() -> Iterator[None]:
  logger, quiet = logging.getLogger("absl"), _QuietUnregisteredItems()
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


def _reader(workdir: str) -> ocp.CheckpointManager:
  """A manager of the run's checkpoints that does not create their directory (it saves
  nothing; orbax's read_only option would say so in two warnings per manager)."""
  return ocp.CheckpointManager(run_dir.checkpoint_dir(workdir),
                               options=ocp.CheckpointManagerOptions(create=False))


def read_checkpoint(workdir: str, step: int) -> dict[str, Any]:
  """Every item saved at `step`: {"params": tree of arrays, "counters": dict, ...}.

  Restored without targets, each item by the handler orbax recorded beside it, so
  whatever `isojax.run.checkpointing.save` writes (params, opt_state, counters, queue,
  critic) is read without this module knowing the list.
  """
  with _quiet_orbax():
    ckpt = _reader(workdir)
    try:
      restored = ckpt.restore(step)
    finally:
      ckpt.close()
    return {name: restored[name] for name in restored.keys()}


def checkpoint_steps(workdir: str) -> list[int]:
  """The steps of a run's checkpoints (those moved aside as corrupt not included)."""
  ckpt = _reader(workdir)
  try:
    return sorted(ckpt.all_steps())
  finally:
    ckpt.close()


def _is_timing(path: tuple[Any, ...]) -> bool:
  last = path[-1] if path else None
  return isinstance(last, jax.tree_util.DictKey) and last.key in TIMING_ARRAYS


def _has_timings(tree: Any) -> bool:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return any(_is_timing(path) for path, _ in flat)


def _leaves(tree: Any) -> dict[str, np.ndarray]:
  """{path: array} of a tree's leaves but the timings, paths as jax writes them
  ("['embed']['kernel']")."""
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat
          if not _is_timing(path)}


def _bits(x: np.ndarray) -> np.ndarray:
  """Each element's bits as an unsigned integer (the array itself for other dtypes)."""
  x = np.ascontiguousarray(x)
  return x.view(f"u{x.itemsize}") if x.itemsize in (1, 2, 4, 8) else x


def _array_difference(base: np.ndarray, new: np.ndarray) -> str | None:
  """None when the arrays are equal bit for bit, else how they differ."""
  if base.dtype != new.dtype or base.shape != new.shape:
    return f"base {base.dtype}{list(base.shape)}, new {new.dtype}{list(new.shape)}"
  differ = _bits(base) != _bits(new)
  if not differ.any():
    return None
  with np.errstate(invalid="ignore"):
    delta = np.abs(base.astype(np.float64) - new.astype(np.float64))
  largest = np.nanmax(delta) if not np.isnan(delta).all() else float("nan")
  return (f"{int(differ.sum())} of {base.size} elements differ, "
          f"max |base - new| = {largest:.3g}")


def compare_trees(base: Any, new: Any, where: str) -> Difference | None:
  """The first leaf path (in the tree's order) whose array differs or one side lacks."""
  b, n = _leaves(base), _leaves(new)
  for path in list(b) + [p for p in n if p not in b]:
    if path not in b or path not in n:
      return Difference("checkpoint", f"{where}{path}",
                        "only in " + ("base" if path in b else "new"))
    detail = _array_difference(b[path], n[path])
    if detail is not None:
      return Difference("checkpoint", f"{where}{path}", detail)
  return None


def _without_timings(value: Any) -> Any:
  """A JSON item with the wall-clock fields of every object in it removed."""
  if isinstance(value, dict):
    return {k: _without_timings(v) for k, v in run_dir.without_timings(value).items()}
  if isinstance(value, list):
    return [_without_timings(v) for v in value]
  return value


def _is_json(item: Any) -> bool:
  """Whether a restored item is JSON (the counters) rather than a tree of arrays."""
  return not any(isinstance(x, (jax.Array, np.ndarray)) for x in jax.tree.leaves(item))


def compare_items(base: dict[str, Any], new: dict[str, Any],
                  where: str) -> Difference | None:
  """Two checkpoints' items: arrays by their bytes, JSON by value without timings.

  Trees of arrays go first: a changed array also changes the fingerprints saved in the
  counters, and its own path says more.
  """
  names = set(base) | set(new)
  timed = {f"{checkpointing.FINGERPRINTS}.{k}" for k in names
           if _has_timings(base.get(k, new.get(k)))}
  for name in sorted(names, key=lambda k: (_is_json(base.get(k, new.get(k))), k)):
    if name not in base or name not in new:
      return Difference("checkpoint", f"{where}{name}",
                        "only in " + ("base" if name in base else "new"))
    b, n = base[name], new[name]
    if _is_json(b) and _is_json(n):
      b, n = ({k: v for k, v in _flatten_json(_without_timings(x)).items() if k not in timed}
              for x in (b, n))
      field = _first_field(b, n)
      if field is not None:
        key, detail = _value_difference(b, n, field)
        return Difference("checkpoint", f"{where}{name}: {key}", detail)
      continue
    found = compare_trees(b, n, f"{where}{name}")
    if found is not None:
      return found
  return None


def compare_checkpoints(base_dir: str, new_dir: str) -> Difference | None:
  """Every step both runs saved, item by item (`compare_layout` reports missing steps)."""
  base_steps, new_steps = checkpoint_steps(base_dir), checkpoint_steps(new_dir)
  for step in sorted(set(base_steps) & set(new_steps)):
    found = compare_items(read_checkpoint(base_dir, step), read_checkpoint(new_dir, step),
                          f"{run_dir.CHECKPOINT_DIR}/{step}/")
    if found is not None:
      return found
  return None


def compare_runs(base_dir: str, new_dir: str) -> list[Difference]:
  """The first difference of each part of two run directories; [] when identical."""
  found = [
      compare_metrics(run_dir.read_metrics(base_dir), run_dir.read_metrics(new_dir)),
      compare_metrics(run_dir.read_events(base_dir), run_dir.read_events(new_dir),
                      "events"),
      compare_config(run_dir.read_config(base_dir), run_dir.read_config(new_dir)),
      compare_layout(layout(base_dir), layout(new_dir)),
      compare_checkpoints(base_dir, new_dir),
  ]
  return [d for d in found if d is not None]
