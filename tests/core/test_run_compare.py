"""isojax.tools.run_compare on run directories written here: equal numbers pass whatever the
timings, and the first changed number is named by step and field or by array path."""

import os

import numpy as np
import pytest

from isojax import metrics, run_dir
from isojax.rl import off_policy, rollout
from isojax.run import checkpointing
from isojax.sampling import sampler
from isojax.tools import run_compare

STEPS = 4


def _lines(changes: dict | None = None, wall: float = 1.0) -> list[dict]:
  """Metrics lines of steps 0..STEPS; `changes` maps (step, field) -> value."""
  lines = []
  for step in range(STEPS + 1):
    line = {"step": step, "rollouts": 16 * step, "tokens": 80 * step,
            "wall_s": wall * step, "train/loss": 0.1 * step, "time/update_s": wall / 3,
            "val/correct_counts": [step, 1, 2]}
    for (at, field), value in (changes or {}).items():
      if at == step:
        line[field] = value
    lines.append(line)
  return lines


def _trees(scale: float = 1.0) -> dict:
  w = np.arange(6, dtype=np.float32).reshape(2, 3) * scale
  return dict(params={"layer": {"w": w, "b": np.zeros(3, np.float32)}},
              opt_state=({"count": np.int32(STEPS), "mu": {"layer": {"w": w / 2}}},))


def _write_run(path, lines=None, config=None, trees=None, wall_s=13.5, event_file="a"):
  """A finished run directory as `isojax.run.train` leaves it: config, metrics, an event
  file, and checkpoints of steps 2 and STEPS."""
  os.makedirs(path)
  run_dir.write_config(path, config or {"seed": 0, "rl": {"kl_coef": 0.0}})
  writer = run_dir.MetricsWriter(path)
  for line in lines or _lines():
    writer.write(line)
  open(os.path.join(path, f"events.out.tfevents.{event_file}.host"), "w").close()
  trees = trees or _trees()
  ckpt = checkpointing.manager(run_dir.checkpoint_dir(path), keep=2)
  for step in (2, STEPS):
    checkpointing.save(ckpt, step, **trees,
                       counters={"counters": {"step": step, "wall_s": wall_s * step}})
  ckpt.close()
  return str(path)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
  return _write_run(tmp_path_factory.mktemp("runs") / "base")


def test_runs_equal_but_for_their_timings_are_identical(base, tmp_path):
  """Another wall clock (metrics, the counters saved with the checkpoints) and another
  event file name: nothing to report."""
  new = _write_run(tmp_path / "new", lines=_lines(wall=7.25), wall_s=99.0, event_file="b")
  assert run_compare.compare_runs(base, new) == []


def test_a_changed_float_is_named_by_its_step_and_field(base, tmp_path):
  """One unit in the last place of step 3's loss (0.1 * 3 is 0.30000000000000004)."""
  new = _write_run(tmp_path / "new", lines=_lines({(3, "train/loss"): 0.3}))
  (found,) = run_compare.compare_runs(base, new)
  assert str(found) == ("metrics: line 4 (step 3), train/loss: "
                        "base 0.30000000000000004, new 0.3")


def test_metrics_differences():
  base = _lines()
  assert run_compare.compare_metrics(base, _lines(wall=2.0)) is None
  changed = run_compare.compare_metrics(base, _lines({(3, "train/loss"): 0.5}))
  assert (changed.where, changed.detail) == ("line 4 (step 3), train/loss",
                                             "base 0.30000000000000004, new 0.5")
  element = run_compare.compare_metrics(base, _lines({(2, "val/correct_counts"): [2, 1, 3]}))
  assert (element.where, element.detail) == ("line 3 (step 2), val/correct_counts[2]",
                                             "base 2, new 3")
  added = run_compare.compare_metrics(base, _lines({(1, "train/kl"): 0.0}))
  assert (added.where, added.detail) == ("line 2 (step 1), train/kl", "only in new")
  shorter = run_compare.compare_metrics(base, base[:-1])
  assert (shorter.where, shorter.detail) == ("line 5", "base has 5 lines, new has 4")
  nan = _lines({(1, "train/loss"): float("nan")})
  assert run_compare.compare_metrics(nan, _lines({(1, "train/loss"): float("nan")})) is None
  assert run_compare.compare_metrics(_lines({(1, "train/loss"): -0.0}),
                                     _lines({(1, "train/loss"): 0.0})) is not None


def test_a_changed_array_element_is_named_by_its_path(base, tmp_path):
  trees = _trees()
  trees["params"]["layer"]["w"] = trees["params"]["layer"]["w"].copy()
  trees["params"]["layer"]["w"][1, 2] += 0.5
  new = _write_run(tmp_path / "new", trees=trees)
  (found,) = run_compare.compare_runs(base, new)
  assert found.part == "checkpoint"
  assert found.where == "checkpoints/2/params['layer']['w']"
  assert found.detail == "1 of 6 elements differ, max |base - new| = 0.5"


def test_arrays_are_compared_by_their_bits():
  zero = {"x": np.zeros(3, np.float32)}
  negative_zero = {"x": -np.zeros(3, np.float32)}
  nan = {"x": np.full(2, np.nan, np.float32)}
  assert run_compare.compare_trees(nan, {"x": nan["x"].copy()}, "") is None
  found = run_compare.compare_trees(zero, negative_zero, "opt_state")
  assert (found.where, found.detail) == ("opt_state['x']",
                                         "3 of 3 elements differ, max |base - new| = 0")
  shape = run_compare.compare_trees(zero, {"x": np.zeros(4, np.float32)}, "")
  assert shape.detail == "base float32[3], new float32[4]"
  extra = run_compare.compare_trees(zero, dict(zero, y=np.ones(1)), "p")
  assert (extra.where, extra.detail) == ("p['y']", "only in new")


def test_checkpoint_counters_are_compared_without_their_timings(base, tmp_path):
  new = _write_run(tmp_path / "new")
  items = run_compare.read_checkpoint(new, STEPS)
  assert sorted(items) == ["counters", "opt_state", "params"]
  items["counters"]["counters"]["batches"] = 3
  found = run_compare.compare_items(run_compare.read_checkpoint(base, STEPS), items,
                                    "checkpoints/4/")
  assert (found.where, found.detail) == ("checkpoints/4/counters: counters.batches",
                                         "only in new")


def test_config_and_layout_differences(base, tmp_path):
  new = _write_run(tmp_path / "new", config={"seed": 0, "rl": {"kl_coef": 0.001}})
  open(os.path.join(new, "extra.txt"), "w").close()
  config, layout = run_compare.compare_runs(base, new)
  assert (config.where, config.detail) == ("config.json: rl.kl_coef", "base 0.0, new 0.001")
  assert (layout.where, layout.detail) == ("extra.txt",
                                           "only in base: nothing; only in new: extra.txt")


def test_layout_stops_at_checkpoint_items_and_names_event_files_by_pattern(base):
  assert run_compare.layout(base) == [
      "checkpoints", "checkpoints/2", "checkpoints/2/_CHECKPOINT_METADATA",
      "checkpoints/2/commit_success.txt", "checkpoints/2/counters",
      "checkpoints/2/opt_state", "checkpoints/2/params",
      "checkpoints/4", "checkpoints/4/_CHECKPOINT_METADATA",
      "checkpoints/4/commit_success.txt", "checkpoints/4/counters",
      "checkpoints/4/opt_state", "checkpoints/4/params",
      "config.json", run_compare.EVENT_FILE_PATTERN, "metrics.jsonl"]


def _queued(step: int, seconds: float, token: int = 5) -> dict:
  """The checkpoint tree of one batch sampled ahead of the update, as an off-policy
  run saves it: rollouts and the wall-clock seconds of sampling them."""
  tokens = np.full((4, 3), token, np.int32)
  rollouts = sampler.Rollouts(tokens=tokens, logprobs=np.full((4, 3), -0.5, np.float32),
                              mask=np.ones((4, 3), bool), finished=np.ones(4, bool),
                              forced=np.zeros((4, 3), bool))
  scored = rollout.ScoredRollouts(
      np.zeros((2, 2), np.int32), np.ones((2, 2), bool), rollouts,
      np.ones((2, 2), np.float32), completions=[],
      timings={k: seconds * (i + 1) for i, k in enumerate(metrics.TIMED_PHASES)})
  generated = off_policy.Generated(step, step - 1, np.arange(2), scored, active_problems=2)
  return off_policy.queue_tree([generated])


def test_the_timing_arrays_are_the_queued_batches_wall_clock_seconds():
  """The keys left out are exactly those whose values change with the clock alone."""
  slow, fast = _queued(3, seconds=2.0)["step_3"], _queued(3, seconds=0.5)["step_3"]
  changed = [k for k in slow if not np.array_equal(slow[k], fast[k])]
  assert tuple(changed) == run_compare.TIMING_ARRAYS


def test_queued_batches_compare_without_their_timings(base, tmp_path):
  """Another clock changes the queue's timings and its saved fingerprint, nothing else;
  another token is named by its path."""
  one = _write_run(tmp_path / "one", trees=dict(_trees(), queue=_queued(3, seconds=2.0)))
  two = _write_run(tmp_path / "two", trees=dict(_trees(), queue=_queued(3, seconds=0.5)))
  assert run_compare.compare_runs(one, two) == []
  other = _write_run(tmp_path / "other",
                     trees=dict(_trees(), queue=_queued(3, seconds=2.0, token=6)))
  (found,) = run_compare.compare_runs(one, other)
  assert (found.where, found.detail) == ("checkpoints/2/queue['step_3']['tokens']",
                                         "12 of 12 elements differ, max |base - new| = 1")
