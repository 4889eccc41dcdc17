"""Robust runs: checkpoint fingerprints and the fallback past damaged checkpoints (on small
trees, then end to end on the micro preset, where the run ends as if never interrupted);
a non-finite update stopping the run before it is checkpointed; event lines in
metrics.jsonl; the config fields of both. The guard's own rules: tests/rl/test_guard.py."""

import copy
import dataclasses
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
import pytest

from isojax import run_dir, storage
from isojax.config import config_lib
from isojax.rl import batch as rl_batch
from isojax.rl import guard, problem_pool
from isojax.run import checkpointing, resume_check, run_state, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _param_file(step_dir, name=None):
  """A parameter data file of a checkpoint: `name`, or the largest one."""
  data_dir = os.path.join(step_dir, "params", "ocdbt.process_0", "d")
  name = name or max(os.listdir(data_dir),
                     key=lambda f: os.path.getsize(os.path.join(data_dir, f)))
  return os.path.join(data_dir, name)


def _flip_zstd_header(step_dir):
  """Damages the compressed frame of the checkpoint's largest parameter file, as a bad
  disk would; returns (file name, damaged bytes)."""
  path = _param_file(step_dir)
  data = bytearray(open(path, "rb").read())
  start = data.find(b"\x28\xb5\x2f\xfd")  # zstd's magic number
  assert start >= 0, f"{path}: expected a zstd frame"
  for i in range(start + 4, start + 12):
    data[i] ^= 0xFF
  open(path, "wb").write(bytes(data))
  return os.path.basename(path), bytes(data)


def _reference_fingerprint(leaves):
  """NumPy: the words of each leaf summed modulo 2**32, leaf i weighted by 2i + 1."""
  total = 0
  for i, x in enumerate(leaves):
    x = np.asarray(x)
    words = x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])
    total += int(words.astype(np.uint64).sum()) * (2 * i + 1)
  return total % 2**32


def _tree(seed):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(size=(64, 64)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(64,)), jnp.bfloat16),
          "count": jnp.asarray(seed, jnp.int32)}


@pytest.mark.parametrize("with_pool", [False, True])
def test_counters_and_pool_come_back_from_a_checkpoint_as_they_were_saved(tmp_path,
                                                                          with_pool):
  counters = run_state.Counters(step=7, rollouts=448, tokens=9001, wall_s=12.5,
                                collapse_streak=2, kept_step=4, batches=9)
  pool = None
  if with_pool:
    pool = problem_pool.ProblemPool(5, threshold=0.75, min_attempts=2)
    pool.update([0, 0, 1, 3, 3, 3], [1.0, 1.0, 0.0, 1.0, 0.5, 1.0])
  ckpt = checkpointing.manager(tmp_path / "ckpt", keep=1)
  checkpointing.save(ckpt, 7, params=_tree(0), opt_state=_tree(1),
                     counters=run_state.counters_tree(counters, pool))
  tree = ckpt.restore(7, args=ocp.args.Composite(counters=ocp.args.JsonRestore())).counters
  ckpt.close()
  got, got_pool = run_state.restored_counters(tree)
  assert got == counters
  if not with_pool:
    assert got_pool is None
    return
  want = {"successes": [2.0, 0.0, 0.0, 2.5, 0.0], "attempts": [2, 1, 0, 3, 0],
          "retired": [True, False, False, True, False]}  # 2/2 and 2.5/3 >= 0.75
  for key, values in want.items():
    np.testing.assert_array_equal(got_pool.to_dict()[key], values)
  assert (got_pool.threshold, got_pool.min_attempts) == (0.75, 2)


def test_fingerprint_matches_numpy_and_sees_one_flipped_bit():
  tree = _tree(0)
  leaves = [tree["b"], tree["count"], tree["w"]]  # jax.tree.leaves order: sorted keys
  assert checkpointing.fingerprint(tree) == _reference_fingerprint(leaves)
  bits = np.asarray(tree["w"]).view(np.uint32).copy()
  bits[17, 3] ^= 1 << 9
  flipped = dict(tree, w=jnp.asarray(bits.view(np.float32)))
  assert checkpointing.fingerprint(flipped) != checkpointing.fingerprint(tree)
  # Two leaves' contents swapped: the same words, in other leaves.
  a, b = jnp.arange(4, dtype=jnp.float32), jnp.arange(4, 8, dtype=jnp.float32)
  assert checkpointing.fingerprint([a, b]) != checkpointing.fingerprint([b, a])


def _save_steps(directory, steps):
  ckpt = checkpointing.manager(directory, keep=len(steps))
  for step in steps:
    checkpointing.save(ckpt, step, params=_tree(step), opt_state={"mu": _tree(step)["w"]},
                       counters={"counters": {"step": step}})
  ckpt.wait_until_finished()
  return ckpt


def test_restore_newest_skips_a_damaged_checkpoint_and_moves_it_aside(tmp_path):
  ckpt = _save_steps(tmp_path / "checkpoints", [2, 4])
  name, damaged = _flip_zstd_header(str(tmp_path / "checkpoints" / "4"))
  restored = checkpointing.restore_newest(
      ckpt, params=_tree(0), opt_state={"mu": _tree(0)["w"]},
      corrupt_dir=tmp_path / "checkpoints" / "corrupt")
  assert restored.step == 2 and restored.counters == {"counters": {"step": 2}}
  np.testing.assert_array_equal(np.asarray(restored.params["w"]), np.asarray(_tree(2)["w"]))
  (failure,) = restored.corrupt
  assert failure.step == 4 and "ZSTD" in failure.error
  assert failure.moved_to == str(tmp_path / "checkpoints" / "corrupt" / "4")
  # Moved, not deleted: the damaged bytes are where the report says.
  assert open(_param_file(failure.moved_to, name), "rb").read() == damaged
  assert ckpt.all_steps() == [2]
  assert checkpointing.manager(tmp_path / "checkpoints", keep=2).all_steps() == [2]
  event = failure.event()
  assert event["event"] == "checkpoint_corrupt" and event["corrupt_step"] == 4


def test_wrong_values_that_restore_without_error_fail_their_fingerprint(tmp_path):
  ckpt = _save_steps(tmp_path / "checkpoints", [2, 4, 6])
  # Step 6's parameter files replaced by step 4's: valid orbax data, not what 6 saved.
  params6 = tmp_path / "checkpoints" / "6" / "params"
  shutil.rmtree(params6)
  shutil.copytree(tmp_path / "checkpoints" / "4" / "params", params6)
  restored = checkpointing.restore_newest(
      ckpt, params=_tree(0), opt_state={"mu": _tree(0)["w"]},
      corrupt_dir=tmp_path / "checkpoints" / "corrupt")
  assert restored.step == 4
  (failure,) = restored.corrupt
  assert failure.step == 6 and "params: fingerprint" in failure.error
  assert str(checkpointing.fingerprint(_tree(4))) in failure.error  # what was found
  assert str(checkpointing.fingerprint(_tree(6))) in failure.error  # what was saved


def test_nothing_is_moved_when_no_checkpoint_restores(tmp_path):
  ckpt = _save_steps(tmp_path / "checkpoints", [2, 4])
  for step in (2, 4):
    _flip_zstd_header(str(tmp_path / "checkpoints" / str(step)))
  with pytest.raises(checkpointing.NoRestorableCheckpoint, match=r"step 4: .*step 2: "):
    checkpointing.restore_newest(ckpt, params=_tree(0), opt_state={"mu": _tree(0)["w"]},
                                 corrupt_dir=tmp_path / "checkpoints" / "corrupt")
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2", "4"]
  assert checkpointing.restore_newest(
      checkpointing.manager(tmp_path / "empty", 2), params=None, opt_state=None,
      corrupt_dir=tmp_path / "empty" / "corrupt") is None


def test_kept_steps_outlive_the_newest_n_until_released(tmp_path):
  kept = checkpointing.KeptSteps({1})
  ckpt = checkpointing.manager(tmp_path / "checkpoints", keep=2, kept=kept)
  for step in range(6):
    checkpointing.save(ckpt, step, params=_tree(step), opt_state={"mu": _tree(step)["w"]},
                       counters={})
  assert ckpt.all_steps() == [1, 4, 5]
  assert checkpointing.newest_at_or_before(ckpt, 3) == 1
  assert checkpointing.newest_at_or_before(ckpt, 0) is None
  kept.steps = set()  # released: the next save's rotation deletes it
  checkpointing.save(ckpt, 6, params=_tree(6), opt_state={"mu": _tree(6)["w"]}, counters={})
  assert ckpt.all_steps() == [5, 6]
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["5", "6"]


def test_going_back_to_an_older_step_moves_the_newer_ones_aside(tmp_path):
  ckpt = _save_steps(tmp_path / "checkpoints", [2, 4, 6])
  with pytest.raises(ValueError, match=r"--resume_step=3: .* has \[2, 4, 6\]"):
    checkpointing.check_step(ckpt, 3)
  checkpointing.check_step(ckpt, 2)
  restored = checkpointing.restore_newest(
      ckpt, params=_tree(0), opt_state={"mu": _tree(0)["w"]}, step=2,
      corrupt_dir=tmp_path / "checkpoints" / "corrupt",
      superseded_dir=tmp_path / "checkpoints" / "superseded")
  assert restored.step == 2 and restored.superseded == (4, 6) and not restored.corrupt
  np.testing.assert_array_equal(np.asarray(restored.params["w"]), np.asarray(_tree(2)["w"]))
  assert ckpt.all_steps() == [2]
  assert sorted(os.listdir(tmp_path / "checkpoints" / "superseded")) == ["4", "6"]
  # Whole, not deleted: orbax still restores what was set aside.
  aside = ocp.CheckpointManager(tmp_path / "checkpoints" / "superseded")
  assert aside.restore(6, args=ocp.args.Composite(
      counters=ocp.args.JsonRestore())).counters["counters"] == {"step": 6}
  aside.close()


def test_a_full_disk_during_a_save_says_so_in_one_line(tmp_path, monkeypatch):
  """What tensorstore raises under orbax when the disk fills (its threads' text): the
  partial directory goes, the checkpoints before it stay, and the error names the
  checkpoint, the bytes its arrays need and the bytes free."""
  ckpt = _save_steps(tmp_path / "checkpoints", [2])
  unraisable = []
  monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(str(u.exc_value)))

  class LateWrite:  # a write completing into orbax's closed event loop
    def __del__(self):
      raise RuntimeError("Event loop is closed")

  def full(self, step, *args, **kwargs):
    partial = tmp_path / "checkpoints" / f"{step}.orbax-checkpoint-tmp-1234" / "params"
    partial.mkdir(parents=True)
    (partial / "data").write_bytes(b"x" * 4096)
    LateWrite()
    raise ValueError('RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database: Failed to '
                     "write 4096 bytes to file 30: No space left on device "
                     "[os_error_code='28']")

  monkeypatch.setattr(ocp.CheckpointManager, "save", full)
  tree = _tree(4)
  with pytest.raises(checkpointing.storage.NoSpace) as error:
    checkpointing.save(ckpt, 4, params=tree, opt_state={"mu": tree["w"]}, counters={})
  needed = sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)) + 64 * 64 * 4
  message = str(error.value)
  assert "\n" not in message
  assert message.startswith("no space left on device saving checkpoint step 4 to "
                            f"{tmp_path / 'checkpoints' / '4'}: it needs up to {needed:,} "
                            "bytes")
  assert "are free there" in message and "step 2, the newest whole one" in message
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
  LateWrite()  # after the error too: the run ends with the one line
  assert unraisable == []
  monkeypatch.undo()
  # Other errors pass through as they were, and so do late writes.
  monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(str(u.exc_value)))

  def other(*args, **kwargs):
    LateWrite()
    raise ValueError("other")

  monkeypatch.setattr(ocp.CheckpointManager, "save", other)
  with pytest.raises(ValueError, match="^other$"):
    checkpointing.save(ckpt, 4, params=tree, opt_state={}, counters={})
  assert unraisable == ["Event loop is closed"]


def test_the_libraries_echoes_of_a_full_disk_are_not_logged():
  """Orbax's writer threads and asyncio's tasks log the error that `storage.NoSpace`
  reports in one line; isojax's own lines and other errors stay."""
  keep = storage.QuietLibraries()
  full = "Task exception was never retrieved: ... No space left on device [os_error_code='28']"

  def record(path, level, message):
    return logging.LogRecord("x", level, path, 1, message, None, None)

  asyncio_path = "/usr/lib/python3.11/asyncio/base_events.py"
  orbax_path = "/site-packages/orbax/checkpoint/future.py"
  assert not keep.filter(record(asyncio_path, logging.ERROR, full))
  assert not keep.filter(record(orbax_path, logging.ERROR, full))
  assert not keep.filter(record(orbax_path, logging.INFO, "saved step 4"))
  assert keep.filter(record(orbax_path, logging.ERROR, "another error"))
  assert keep.filter(record(asyncio_path, logging.INFO, "anything"))
  assert keep.filter(record("/work/isojax/run/train.py", logging.WARNING, full))


def _line(step, **kw):
  return dict(step=step, rollouts=step * 8, tokens=step * 40, wall_s=step * 1.5, **kw)


def test_event_lines_are_kept_apart_from_metrics_and_truncated_on_resume(tmp_path):
  w = run_dir.MetricsWriter(str(tmp_path))
  for s in range(5):
    w.write(_line(s, **{"train/reward": s / 10}))
    if s in (1, 3):
      w.write(_line(s, event="collapse", message=f"at {s}"))
  assert [r["step"] for r in run_dir.read_metrics(str(tmp_path))] == [0, 1, 2, 3, 4]
  assert [(r["step"], r["event"]) for r in run_dir.read_events(str(tmp_path))] == [
      (1, "collapse"), (3, "collapse")]
  run_dir.MetricsWriter(str(tmp_path), resume_step=2)  # drops what followed step 2
  assert [r["step"] for r in run_dir.read_metrics(str(tmp_path))] == [0, 1, 2]
  assert [r["message"] for r in run_dir.read_events(str(tmp_path))] == ["at 1"]


class _Closes:
  """A stand-in for what a run closes (bar, viewers, source) and writes nothing to."""
  write = close = lambda *_: None
  checkpoint_tree = discarded_rollouts = lambda self: None


def _state(tmp_path, ckpt, writer, learner=None) -> run_state.RunState:
  opened = run_state.Workdir(str(tmp_path), ckpt, checkpointing.KeptSteps(), primary=True)
  return run_state.RunState(opened, run_state.Counters(), pool=None, learner=learner,
                            writer=writer, viewers=_Closes(), source=_Closes(), bar=_Closes())


def test_a_run_flushes_metrics_held_for_an_object_store_when_it_closes(tmp_path,
                                                                       monkeypatch):
  """Lines an object store's writer holds back reach the file when the run ends, even
  after an error, and before each checkpoint (`RunState.save` flushes first)."""
  writer = run_dir.MetricsWriter(str(tmp_path), rewrite_every_s=3600.0)
  monkeypatch.setattr(writer, "_appends", False)  # as on gs://, without a bucket

  class Checkpoints:
    wait_until_finished = close = lambda self: None

  state = _state(tmp_path, Checkpoints(), writer,
                 learner=types.SimpleNamespace(params={}, opt_state={}, critic=None, lora=False))
  for step in range(2):
    state.counters.step = step
    state.record({"train/reward": step / 4})
  assert run_dir.read_metrics(str(tmp_path)) == []
  at_save = []
  monkeypatch.setattr(checkpointing, "save", lambda *_, **__: at_save.append(
      [r["step"] for r in run_dir.read_metrics(str(tmp_path))]))
  state.save()
  assert at_save == [[0, 1]]
  state.counters.step = 2
  state.record({"train/reward": 0.5})
  state.close(RuntimeError, RuntimeError("boom"), None)
  assert [(r["step"], r["train/reward"]) for r in run_dir.read_metrics(str(tmp_path))] == [
      (0, 0.0), (1, 0.25), (2, 0.5)]


def test_a_failed_metrics_flush_still_closes_the_checkpoints(tmp_path):
  closed = []

  class Checkpoints:
    def wait_until_finished(self):
      closed.append("wait")

    def close(self):
      closed.append("close")

  class Writer:
    def flush(self):
      raise OSError("the bucket refused the write")

  state = _state(tmp_path, Checkpoints(), Writer())
  with pytest.raises(OSError, match="refused"):
    state.close()
  assert closed == ["wait", "close"]


@pytest.mark.parametrize("field,value,message", [
    ("checkpoint_keep", 0, "checkpoint_keep=0"),
    ("guard.collapse_steps", -1, "guard.collapse_steps=-1"),
    ("guard.stop_on_collapse", "yes", "guard.stop_on_collapse='yes'"),
])
def test_bad_robustness_fields_are_named(field, value, message):
  fields = config_lib.base_config().to_dict()
  fields["num_steps"] = 10
  parent, _, leaf = field.rpartition(".")
  (fields[parent] if parent else fields)[leaf] = value
  # From a plain dict (as a JSON config is), where ml_collections checks no types.
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(ml_collections.ConfigDict(fields))


def test_stop_on_collapse_needs_a_collapse_window():
  c = config_lib.base_config()
  c.num_steps = 10
  c.guard.update(collapse_steps=0, stop_on_collapse=True)
  with pytest.raises(ValueError, match="guard.collapse_steps > 0"):
    config_lib.resolve(c)


def _micro(cache_dir):
  # The easy recipe's KL and entropy terms move the parameters at every step, so a
  # checkpoint of one step differs from the next even while the reward is still 0.
  module = importlib.import_module("isojax.configs.easy")
  config = module.get_config("micro")
  del cache_dir  # the shipped base model: nothing to build
  config.update(dict(num_steps=4, checkpoint_every=2))
  config.eval.train_problems = 0  # no pass@1 histogram: faster, and not under test
  return config


def _metrics(workdir):
  return [run_dir.without_timings(r) for r in run_dir.read_metrics(str(workdir))]


def _saved(workdir, step):
  """(params leaves, saved JSON) of one checkpoint, read with orbax directly."""
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(str(workdir)))
  restored = ckpt.restore(step, args=ocp.args.Composite(
      params=ocp.args.StandardRestore(), counters=ocp.args.JsonRestore()))
  ckpt.close()
  return [np.asarray(x) for x in jax.tree.leaves(restored.params)], restored.counters


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  """An uninterrupted 4-step run (checkpoints at steps 2 and 4) and its config."""
  root = tmp_path_factory.mktemp("robust")
  config = _micro(root / "cache")
  train.run(config, str(root / "full"))
  assert sorted(os.listdir(run_dir.checkpoint_dir(str(root / "full")))) == ["2", "4"]
  return root / "full", config


def test_damaged_latest_checkpoint_resumes_from_the_previous_one(full_run, tmp_path):
  full, config = full_run
  workdir = tmp_path / "damaged"
  shutil.copytree(full, workdir)
  ckpt_dir = run_dir.checkpoint_dir(str(workdir))
  name, damaged = _flip_zstd_header(os.path.join(ckpt_dir, "4"))
  train.run(config, str(workdir))

  assert _metrics(workdir) == _metrics(full)
  (event,) = run_dir.read_events(str(workdir))
  assert event["event"] == "checkpoint_corrupt" and event["step"] == 2
  assert event["corrupt_step"] == 4 and "ZSTD" in event["error"]
  assert event["moved_to"] == os.path.join(ckpt_dir, "corrupt", "4")
  # Moved aside with its damaged bytes, not deleted; step 4 saved again, as before.
  assert open(_param_file(event["moved_to"], name), "rb").read() == damaged
  assert sorted(os.listdir(ckpt_dir)) == ["2", "4", "corrupt"]
  (params, counters), (want_params, want_counters) = _saved(workdir, 4), _saved(full, 4)
  assert counters["fingerprints"] == want_counters["fingerprints"]
  for got, want in zip(params, want_params, strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_fallback_to_an_older_checkpoint_checks_the_settings_of_that_step(full_run,
                                                                             tmp_path):
  """The learning rate was changed (allowed) at step 3, so checkpoint 4 has the new one
  and checkpoint 2 the old. With 4 damaged, a resume with the new rate restarts at step
  2, where it is a change: refused, naming it, with config.json as it was."""
  full, config = full_run
  workdir = tmp_path / "fallback"
  shutil.copytree(full, workdir)
  old = config.optim.learning_rate
  with open(run_dir.config_history_path(str(workdir)), "w") as f:
    f.write(json.dumps({"step": 3, "time": "2026-01-01T00:00:00", "changed": {
        "optim.learning_rate": {"old": old, "new": old * 10}}}) + "\n")
  _flip_zstd_header(os.path.join(run_dir.checkpoint_dir(str(workdir)), "4"))
  config_json = (workdir / "config.json").read_bytes()
  faster = copy.deepcopy(config)
  faster.optim.learning_rate = old * 10
  with pytest.raises(resume_check.SettingsChanged, match=re.escape(
      f"resuming at step 2 with changed settings: optim.learning_rate {old} -> {old * 10}")):
    train.run(faster, str(workdir))
  assert (workdir / "config.json").read_bytes() == config_json


def test_non_finite_update_stops_before_its_checkpoint(full_run, tmp_path, monkeypatch):
  full, config = full_run
  build = rl_batch.build_train_batch
  calls = []

  # The update of step 4, which would be evaluated and checkpointed, gets NaN advantages.
  def nan_at_step_4(*args, **kwargs):
    batch, zero_var_G = build(*args, **kwargs)
    calls.append(1)
    if len(calls) == 4:
      batch = dataclasses.replace(batch, advantages=np.full_like(batch.advantages, np.nan))
    return batch, zero_var_G

  monkeypatch.setattr(rl_batch, "build_train_batch", nan_at_step_4)
  workdir = tmp_path / "diverged"
  with pytest.raises(guard.RunStopped) as stopped:
    train.run(config, str(workdir))
  message = str(stopped.value)
  assert message.startswith("step 4: non-finite train/loss=nan, train/grad_norm=nan, params")
  assert "The last checkpoint, step 2 in" in message

  # Nothing of step 4 was evaluated, logged or saved; the event names what was not finite.
  assert _metrics(workdir) == _metrics(full)[:4]
  (event,) = run_dir.read_events(str(workdir))
  assert event["step"] == 4 and event["event"] == "non_finite"
  assert event["quantities"] == ["train/loss", "train/grad_norm", "params"]
  assert sorted(os.listdir(run_dir.checkpoint_dir(str(workdir)))) == ["0", "2"]
  params, _ = _saved(workdir, 2)
  want, _ = _saved(full, 2)
  for got, expected in zip(params, want, strict=True):
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, expected)

  # The last good checkpoint resumes the run, which then ends as if never stopped.
  monkeypatch.setattr(rl_batch, "build_train_batch", build)
  train.run(config, str(workdir))
  assert _metrics(workdir) == _metrics(full)
  assert run_dir.read_events(str(workdir)) == []  # left with the lines after step 2


def _collapse_flags(learning_rate):
  """A micro run that `learning_rate=100` collapses within its first steps: evaluated at
  steps 0 and 8 only, stopped after 4 collapsed steps in a row."""
  return ["--config=configs/hard.py:micro", "--config.num_steps=8",
          "--config.checkpoint_every=2", f"--config.optim.learning_rate={learning_rate}",
          "--config.guard.stop_on_collapse=True", "--config.guard.collapse_steps=4",
          "--config.eval.every=100", "--config.eval.train_problems=0"]


@pytest.mark.slow("a collapsing run and its resume")
def test_a_collapse_keeps_a_checkpoint_from_before_it_to_resume_with_a_lower_lr(tmp_path):
  config = importlib.import_module("isojax.configs.hard").get_config("micro")
  config.update(dict(num_steps=8, checkpoint_every=2))
  config.optim.learning_rate = 100.0
  config.guard.update(stop_on_collapse=True, collapse_steps=4)
  config.eval.update(every=100, train_problems=0)
  workdir = tmp_path / "run"
  with pytest.raises(guard.RunStopped) as stopped:
    train.run(config, str(workdir))

  # When the collapse began, from the metrics: the first step of the last streak of zero
  # reward and zero gradient. Its rollouts came from the policy of the step before.
  lines = run_dir.read_metrics(str(workdir))[1:]
  zero = [r["train/reward"] == 0 and r["train/grad_norm"] == 0 for r in lines]
  began = next(r["step"] for i, r in enumerate(lines) if all(zero[i:]))
  (event,) = run_dir.read_events(str(workdir))
  assert event["event"] == "collapse" and event["step"] == began + 3 == lines[-1]["step"]
  saved = list(range(0, event["step"], 2))  # steps 0, 2, ... before the stop
  healthy = max(s for s in saved if s <= began - 2)
  assert event["kept_step"] == healthy
  present = sorted({healthy, *saved[-2:]})  # beside the newest checkpoint_keep=2
  assert sorted(int(s) for s in os.listdir(run_dir.checkpoint_dir(str(workdir)))) == present
  assert f"--resume_step={healthy} --allow_changed=optim.learning_rate" in str(stopped.value)

  # The rerun the message names, with a lower LR, goes back to the healthy checkpoint.
  proc = subprocess.run(
      [sys.executable, "-m", "isojax.main", *_collapse_flags(1e-4), f"--workdir={workdir}",
       f"--resume_step={healthy}", "--allow_changed=optim.learning_rate"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert run_dir.read_config(str(workdir))["optim"]["learning_rate"] == 100.0
  (line,) = run_dir.read_config_history(str(workdir))
  newer = [s for s in present if s > healthy]
  assert line["step"] == healthy and line["superseded_checkpoints"] == newer
  assert line["changed"] == {"optim.learning_rate": {"old": 100.0, "new": 1e-4}}
  (event,) = run_dir.read_events(str(workdir))
  assert event["event"] == "settings_changed" and event["step"] == healthy
  resumed = run_dir.read_metrics(str(workdir))
  assert [r["step"] for r in resumed] == list(range(9))
  assert all(r["train/learning_rate"] < 1e-4 for r in resumed[1:])
  assert any(r["train/reward"] > 0 for r in resumed[began:])  # no collapse this time
  assert sorted(int(s) for s in os.listdir(
      run_dir.superseded_checkpoint_dir(str(workdir)))) == newer
