"""A sweep directory's manifest (`sweep.json`) and plans: `prepare` writes every
run's plan.json and the manifest, with each run's state read from its files.

A sweep rerun at a larger budget with `extend` trains its runs on past their old end
(`resume_check`: the same run trained longer) instead of refusing the changed plans:
each plan.json is rewritten with the new length (and what follows from it: the budget,
the evaluation and checkpoint cadence, and a splits directory that moved with a copied
sweep when its split file is the same), and its manifest entry records the allowance
the run is resumed with. `evals_per_run` may change with the budget: the extended run
evaluates where the new plan puts its evaluations past the old end.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import ml_collections
from absl import logging

from isojax import run_dir, storage
from isojax.config import config_lib
from isojax.sweeps.layout import (DONE, FAILED, MANIFEST_FILE, PENDING, PLAN_FILE, RUNS_DIR,
                                  plan_path, run_dir_of)
from isojax.sweeps.plan import plan_runs
from isojax.sweeps.sweep_config import SweepError
from isojax.tasks import splits

_MANIFEST_VERSION = 1


def final_metrics(workdir: str, num_steps: int) -> dict[str, float] | None:
  """The last line's validation metrics if the run reached num_steps, else None."""
  try:
    last = run_dir.last_metrics(workdir)
  except run_dir.RunFormatError:
    return None
  if last is None or last[run_dir.STEP] != num_steps:
    return None
  return {k: v for k, v in last.items()
          if k.startswith("val/") and isinstance(v, (int, float))}


def read_manifest(out_dir: str) -> dict[str, Any] | None:
  path = storage.path(out_dir) / MANIFEST_FILE
  if not path.is_file():
    return None
  try:
    return storage.read_json(path)
  except ValueError as e:
    raise SweepError(f"{e}; delete it to rebuild it from the run directories") from e


def write_manifest(out_dir: str, manifest: dict[str, Any]) -> None:
  manifest["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
  storage.write_json(storage.path(out_dir) / MANIFEST_FILE, manifest)


# The plan fields an extension changes; those of them a resume must be allowed to change.
# `eval.count` (evals_per_run) may change with it: where a run evaluates does not change
# what it trains, and a denser schedule sharpens the fits' late points.
EXTENSION_FIELDS = ("num_steps", "budget_rollouts", "eval.every", "eval.count",
                    "checkpoint_every", "task.splits_dir")
_EXTENSION_ALLOWANCE = ("num_steps", "eval.every", "eval.count", "task.splits_dir")


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    if isinstance(v, dict):
      out.update(_flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def _plan_change(path: str, config: dict[str, Any], extend: bool = False
                 ) -> tuple[bool, list[str]]:
  """Whether plan.json at `path` must be (re)written with `config`, and the fields its run
  must be allowed to change on resume (empty unless the plan is extended); raises
  SweepError if the plan there is another run's. Reads only.

  With `extend`, a plan there that is this one cut shorter is replaced."""
  config = _as_json(config)
  if not storage.path(path).is_file():
    return True, []
  existing = storage.read_json(path)
  if existing == config:
    return False, []
  old, new = _flatten(existing), _flatten(config)
  # A field the plan predates is unchanged when the new plan gives it its default:
  # `from_json` fills absent fields with the defaults, so the run is the same run.
  defaults = _flatten(_as_json(config_lib.base_config().to_dict()))
  changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k)
                   and not (k not in old and k in defaults and new[k] == defaults[k]))
  if not changed:
    return False, []
  longer = (set(changed) <= set(EXTENSION_FIELDS) and "num_steps" in changed
            and new["num_steps"] > old["num_steps"] and _same_split(old, new))
  if extend and longer:
    return True, [f for f in _EXTENSION_ALLOWANCE if f in changed]
  hint = (f"; or extend it (--extend) from {old['num_steps']} to {new['num_steps']} steps"
          if longer else "")
  raise SweepError(
      f"{path}: the run there was planned differently (changed: {', '.join(changed)}); "
      f"use a new --out, or delete that run directory to redo it{hint}")


def _as_json(config: dict[str, Any]) -> dict[str, Any]:
  return json.loads(json.dumps(config))  # as JSON holds it (tuples become lists)


def _same_split(old: dict[str, Any], new: dict[str, Any]) -> bool:
  """Whether two flat plans train and evaluate on the same split: the same directory, or
  one whose split holds the same problems (a copy, or the same profile made again)."""
  if old.get("task.splits_dir") == new.get("task.splits_dir"):
    return True
  if not new.get("task.split"):
    return False
  try:
    payloads = [splits.read_split(p["task.splits_dir"], p["task.split"]) for p in (old, new)]
  except (FileNotFoundError, ValueError):
    return False
  return all(payloads[0][k] == payloads[1][k] for k in splits.SPLIT_KEYS)


def prepare(sweep: ml_collections.ConfigDict, out_dir: str, backend: str,
            extend: bool = False) -> dict[str, Any]:
  """Writes every plan.json and the manifest, with each run's state from its files;
  `extend` trains runs planned shorter on to this plan's length (see the module)."""
  runs = plan_runs(sweep)
  if extend and backend != "local":
    raise SweepError(f"--extend runs with --backend=local (asked: {backend})")
  # Every plan is checked before any is written: a refused sweep changes nothing.
  changes = {r.name: _plan_change(plan_path(out_dir, r.name), r.config, extend)
             for r in runs}
  old = {e["name"]: e for e in (read_manifest(out_dir) or {}).get("runs", [])}
  stale = sorted(set(old) - {r.name for r in runs})
  if extend and stale and all(changes[r.name] == (True, []) for r in runs):
    # Nothing of this sweep is there to extend, only other runs (often: other --seeds).
    raise SweepError(f"--extend: none of the runs planned ({', '.join(r.name for r in runs)})"
                     f" is in {out_dir}, which holds {', '.join(stale)}; expected the "
                     "sweep those runs were planned with (the same seeds name the same runs)")
  for r in runs:
    if changes[r.name][0]:
      storage.write_json(plan_path(out_dir, r.name), _as_json(r.config), indent=2,
                         sort_keys=True)
  allowances = {name: allowance for name, (_, allowance) in changes.items()}
  if stale:
    logging.warning("runs %s are in %s but not in this sweep config; the analysis of "
                    "%s/ still includes them", stale, MANIFEST_FILE, RUNS_DIR)
  entries = []
  for r in runs:
    entry = dict(old.get(r.name, {}), name=r.name, **r.allocation.to_dict(),
                 seed=r.config["seed"], plan=os.path.join(RUNS_DIR, r.name, PLAN_FILE))
    entry.setdefault("attempts", 0)
    # Kept in the entry: a launcher that stopped before the run resumed passes it again,
    # and once the run's history has the change, passing it changes nothing.
    if allowances[r.name]:
      entry["allow_changed"] = allowances[r.name]
    final = final_metrics(run_dir_of(out_dir, r.name), r.allocation.num_steps)
    if final is not None:
      entry.update(state=DONE, final=final)
    elif entry.get("state") != FAILED:
      # Never started, interrupted, or marked done by files that disagree: (re)run it.
      entry.update(state=PENDING, final=None)
    entries.append(entry)
  # What the sweep spends in all: every allocation's budget once per seed.
  total = sum(r.allocation.rollouts for r in runs)
  manifest = dict(version=_MANIFEST_VERSION, name=sweep.name, out_dir=storage.absolute(out_dir),
                  backend=backend, sweep_config=sweep.to_dict(), total_rollouts=total,
                  runs=entries)
  write_manifest(out_dir, manifest)
  return manifest


def format_final(final: dict[str, float] | None) -> str:
  """A run's final validation metrics on one line."""
  if not final:
    return "no metrics"
  return " ".join(f"{k}={v:.4f}" for k, v in sorted(final.items())
                  if not k.endswith("_stderr"))
