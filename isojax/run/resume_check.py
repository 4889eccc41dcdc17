"""What a resumed run must share with the run it resumes: its settings cannot drift.

`config.json` is written once, by the run that creates the workdir. A rerun that finds a
checkpoint compares its settings with the ones the run used up to that checkpoint
(`config.json`, with the changes of `config_history.jsonl` applied) before it writes
anything, and is refused, naming every changed field with both values, unless
`--allow_changed` names it. An allowed change is appended to the history (step, fields,
old and new values) and recorded as a `settings_changed` event in `metrics.jsonl`;
`config.json` keeps the first values.

A setting is every config field but those that say how or where the run works rather
than what it computes (`NOT_SETTINGS`: the metric viewers, checkpoint and log cadence,
the guard, the device layout, verifier workers), which a resume may change freely. The
passes that `memory_plan` fills in from the machine when left at 0 (`PLANNED`) are
compared only when the resume sets them by hand. The allocation (`FIXED`) defines the
run: no allowance changes it, except an extension. `--allow_changed=num_steps` lets a
resume raise M (and C = B_p * n * M with it), never lower it: every key and the problem
order are functions of the step and the LR schedule is constant after its warm-up, so
the run trained on past its old end computes what a run planned that long from the start
computes (its evaluations fall where each plan put them). It is refused for an off-policy
pipeline (`rl.max_staleness` > 0), whose last batches were sampled for the old end. A
field that `config.json` lacks (added to isojax after the run began) is not compared.

Pure functions of dicts and the workdir's files: no JAX.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

import ml_collections

from isojax import metrics, run_dir, storage
from isojax.config import config_lib

# The allocation: the run's point in a sweep. A change needs a new --workdir.
FIXED = ("rollouts_per_problem", "problems_per_batch", "num_steps", "budget_rollouts", "seed")
# Fields (or sections) that do not change what the run computes.
NOT_SETTINGS = ("metric_writers", "checkpoint_every", "checkpoint_keep", "log_every", "guard",
                "mesh.data", "mesh.fsdp", "mesh.tensor", "task.verifier_workers")
# Set from the machine's memory when 0 (run_inputs.plan_passes); compared only when set by hand.
PLANNED = ("rl.micro_batch_size", "rl.logprob_chunk_size", "sampling.max_rollouts_per_call")
# The allocation fields an extension changes (allowed by naming `num_steps`).
EXTENSION = ("num_steps", "budget_rollouts")


class SettingsChanged(ValueError):
  """A resume whose settings differ from the run's without an allowance, or an allowance
  that names no field or one of the allocation."""


def dotted_fields(config: ml_collections.ConfigDict | dict[str, Any]) -> dict[str, Any]:
  """The config as dotted field -> value, with values as config.json holds them (JSON:
  tuples as lists). Free-form sections (`task.dataset_kwargs`) are one value."""
  as_dict = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  return _flatten(json.loads(json.dumps(as_dict, default=storage.json_default)))


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict) and name not in config_lib.FREE_FORM_FIELDS:
      flat.update(_flatten(value, name + "."))
    else:
      flat[name] = value
  return flat


def _under(name: str, fields: Iterable[str]) -> bool:
  return any(name == f or name.startswith(f + ".") for f in fields)


def _changes_until(workdir: storage.PathLike, step: int) -> dict[str, Any]:
  """{field: value} of the history's changes made at or before `step`, the later ones
  winning. A history line at step t ends the lines after t written before it: the run
  went back to t, and what followed was discarded."""
  live: list[dict[str, Any]] = []
  for line in run_dir.read_config_history(workdir):
    live = [kept for kept in live if kept[run_dir.STEP] <= line[run_dir.STEP]] + [line]
  return {name: change["new"] for line in live if line[run_dir.STEP] <= step
          for name, change in line["changed"].items()}


def recorded(workdir: storage.PathLike, step: int) -> dict[str, Any]:
  """The settings the run in `workdir` used at `step` (dotted, as `dotted_fields`)."""
  return {**dotted_fields(run_dir.read_config(workdir)), **_changes_until(workdir, step)}


def config_at(workdir: storage.PathLike, step: int) -> dict[str, Any]:
  """config.json as the run had it at `step`: nested, with the history's changes."""
  config = run_dir.read_config(workdir)
  for name, value in _changes_until(workdir, step).items():
    *parents, leaf = name.split(".")
    node = config
    for part in parents:
      node = node[part]
    node[leaf] = value
  return config


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """{field: {"old": ..., "new": ...}} for the settings that differ (see the module)."""
  changed = {}
  for name, new in after.items():
    if name not in before or _under(name, NOT_SETTINGS):
      continue
    if name in PLANNED and new == 0:
      continue
    if before[name] != new:
      changed[name] = {"old": before[name], "new": new}
  return changed


def check(workdir: storage.PathLike, requested: dict[str, Any], *, step: int,
          allow: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
  """The changes of a resume at `step` with the settings `requested` (`dotted_fields(config)`
  before the memory plan), all of them allowed; raises `SettingsChanged` naming those
  `allow` leaves out, and any of the allocation. Reads only."""
  allow = tuple(allow)
  check_allowance(allow)
  changed = changes(recorded(workdir, step), requested)
  config = run_dir.config_path(workdir)
  fixed = {n: c for n, c in changed.items() if n in FIXED}
  if fixed and _is_extension(fixed, requested, allow, config):
    fixed = {}
  if fixed:
    had = ", ".join(f"{n}={c['old']}" for n, c in fixed.items())
    asked = ", ".join(f"{n}={c['new']}" for n, c in fixed.items())
    longer = _extends(fixed) and fixed["num_steps"]["new"] > fixed["num_steps"]["old"]
    raise SettingsChanged(f"{config}: the run in this workdir has different {had} (asked "
                          f"for {asked}); the allocation defines a run: use a new --workdir"
                          + (", or pass --allow_changed=num_steps to train this run on "
                             "past its end" if longer else ""))
  refused = {n: c for n, c in changed.items()
             if not _under(n, allow) and not (n in EXTENSION and "num_steps" in allow)}
  if refused:
    raise SettingsChanged(
        f"{config}: resuming at step {step} with changed settings: {describe(refused)}. "
        f"Rerun with the run's values, or pass --allow_changed={','.join(refused)} to "
        f"record the change in {run_dir.CONFIG_HISTORY_FILE} and go on, or use a new "
        "--workdir")
  return changed


def _extends(fixed: dict[str, dict[str, Any]]) -> bool:
  """Whether the allocation's changes are the run's length alone (M, and C with it)."""
  return "num_steps" in fixed and set(fixed) <= set(EXTENSION)


def _is_extension(fixed: dict[str, dict[str, Any]], requested: dict[str, Any],
                  allow: tuple[str, ...], config: Any) -> bool:
  """Whether the allocation's changes `fixed` are an allowed extension (see the module);
  raises SettingsChanged for an extension that is not the same run trained longer."""
  if "num_steps" not in allow or not _extends(fixed):
    return False
  old, new = fixed["num_steps"]["old"], fixed["num_steps"]["new"]
  if new < old:
    raise SettingsChanged(f"{config}: num_steps {old} -> {new}: an extension raises "
                          "num_steps; a shorter run is a prefix of this one (read its "
                          "metrics.jsonl up to that step) or a new --workdir")
  if requested.get("rl.max_staleness"):
    raise SettingsChanged(
        f"{config}: num_steps {old} -> {new} with rl.max_staleness="
        f"{requested['rl.max_staleness']}: the off-policy pipeline sampled its last batches "
        "for the old end, so the extended run would not be the longer run; use a new "
        "--workdir")
  return True


def check_allowance(allow: Iterable[str]) -> None:
  """Raises SettingsChanged for a name that is no config field, or one of the allocation."""
  names = [name for name in allow if name]
  unknown = config_lib.unknown_names(names)
  if unknown:
    raise SettingsChanged(f"--allow_changed: unknown config field(s) "
                     f"{config_lib.describe_unknown(unknown)}")
  fixed = [name for name in names if name in FIXED and name != "num_steps"]
  if fixed:
    raise SettingsChanged(f"--allow_changed={','.join(fixed)}: the allocation "
                     f"({', '.join(FIXED)}) defines a run and cannot change on resume, "
                     "except num_steps raised (an extension): use a new --workdir")


def describe(changed: dict[str, dict[str, Any]]) -> str:
  """'optim.learning_rate 100.0 -> 0.001, sampling.temperature 0.6 -> 1.0'."""
  return ", ".join(f"{n} {json.dumps(c['old'])} -> {json.dumps(c['new'])}"
                   for n, c in changed.items())


def needs_record(workdir: storage.PathLike, step: int, changed: dict[str, Any],
                 superseded: Iterable[int]) -> bool:
  """A history line is due when settings changed, when checkpoints after `step` were set
  aside, or when history lines after `step` must be ended (see `recorded`)."""
  later = any(line[run_dir.STEP] > step for line in run_dir.read_config_history(workdir))
  return bool(changed) or bool(tuple(superseded)) or later


def record(workdir: storage.PathLike, step: int, changed: dict[str, dict[str, Any]],
           superseded: Iterable[int] = ()) -> dict[str, Any] | None:
  """Appends the resume at `step` to config_history.jsonl; returns the `settings_changed`
  event for metrics.jsonl (None when no setting changed)."""
  superseded = sorted(superseded)
  run_dir.append_config_history(workdir, {
      run_dir.STEP: step, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "changed": changed,
      **({"superseded_checkpoints": superseded} if superseded else {})})
  if not changed:
    return None
  return {run_dir.EVENT: metrics.EVENT_SETTINGS_CHANGED, "changed": changed,
          "message": f"resumed at step {step} with {describe(changed)} (--allow_changed); "
                     f"{run_dir.CONFIG_HISTORY_FILE} holds every change, config.json the "
                     "first values"}
