"""TensorBoard and W&B hold what metrics.jsonl holds: read back with TensorBoard's own
reader (EventAccumulator), histograms as histograms, resumes purged like the file."""

import importlib.util
import os
import shutil
import sys
import types

import ml_collections
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from isojax import metric_writers, metrics, run_dir
from isojax.config import config_lib
from isojax.run import train

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HIST = metrics.TRAIN_PASS1_HISTOGRAM


def _settings(**overrides):
  settings = config_lib.base_config().metric_writers
  settings.update(overrides)
  return settings


def _line(step, reward, **kw):
  return {"step": step, "rollouts": step * 32, "tokens": step * 250, "wall_s": step * 0.5,
          "train/reward": reward, **kw}


def _read_tensorboard(logdir):
  """{tag: {step: value}} of the scalars and {tag: {step: HistogramValue}} TensorBoard
  shows for `logdir` (after its purges of resumed runs)."""
  acc = event_accumulator.EventAccumulator(
      str(logdir), size_guidance={event_accumulator.SCALARS: 0,
                                  event_accumulator.HISTOGRAMS: 0})
  acc.Reload()
  scalars = {}
  for tag in acc.Tags()["scalars"]:
    events = acc.Scalars(tag)
    assert len({e.step for e in events}) == len(events), f"{tag}: a step logged twice"
    scalars[tag] = {e.step: e.value for e in events}
  histograms = {tag: {e.step: e.histogram_value for e in acc.Histograms(tag)}
                for tag in acc.Tags()["histograms"]}
  return scalars, histograms


def _assert_same_as_jsonl(workdir):
  """Every number of metrics.jsonl is a TensorBoard scalar at its step (float32), every
  histogram list a TensorBoard histogram with those bucket counts, and nothing more."""
  lines = run_dir.read_metrics(str(workdir))
  scalars, histograms = _read_tensorboard(workdir)
  expected_scalars, expected_histograms = {}, {}
  for line in lines:
    for key, value in line.items():
      if key in metrics.HISTOGRAMS:
        expected_histograms.setdefault(key, {})[line["step"]] = value
      elif key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
        expected_scalars.setdefault(key, {})[line["step"]] = value
  assert expected_scalars and set(scalars) == set(expected_scalars)
  for tag, by_step in expected_scalars.items():
    assert set(scalars[tag]) == set(by_step), tag
    for step, value in by_step.items():
      assert scalars[tag][step] == pytest.approx(value, rel=1e-6, abs=1e-6), (tag, step)
  assert set(histograms) == set(expected_histograms)
  for tag, by_step in expected_histograms.items():
    assert set(histograms[tag]) == set(by_step), tag
    for step, counts in by_step.items():
      h = histograms[tag][step]
      assert list(h.bucket) == counts and h.num == sum(counts)
      # Bucket c holds the value c: its right edge is c + 0.5.
      assert list(h.bucket_limit) == [c + 0.5 for c in range(len(counts))]
  return lines


def test_split_record_keeps_numbers_and_histograms():
  step, scalars, histograms = metric_writers.split_record(
      {**_line(3, 0.25), HIST: [4, 0, 2], "event": "collapse", "flag": True,
       "n": np.int64(7), "x": np.float32(0.5),
       metrics.VAL_CORRECT_COUNTS: [2, 0, 1], metrics.TRAIN_PASS1_COUNTS: [0, 0, 2, 1]})
  assert step == 3
  assert scalars == {"rollouts": 96.0, "tokens": 750.0, "wall_s": 1.5, "train/reward": 0.25,
                     "n": 7.0, "x": 0.5}
  assert histograms == {HIST: [4, 0, 2]}


def test_histogram_stats_match_the_samples_they_count():
  counts = [3, 0, 5, 1, 0]
  samples = np.repeat(np.arange(len(counts)), counts)  # 0,0,0,2,2,2,2,2,3
  stats = metric_writers.histogram_stats(counts)
  assert (stats["min"], stats["max"], stats["num"]) == (0, 3, samples.size)
  assert stats["sum"] == samples.sum() and stats["sum_squares"] == (samples**2).sum()
  edges = np.concatenate([[-0.5], stats["bucket_limits"]])
  assert np.histogram(samples, bins=edges)[0].tolist() == stats["bucket_counts"] == counts


def test_tensorboard_holds_metrics_jsonl_across_a_resume(tmp_path):
  workdir = str(tmp_path / "run")
  jsonl = run_dir.MetricsWriter(workdir)
  viewers = metric_writers.create(_settings(), workdir, resume_step=None)
  for step in range(6):
    extra = {HIST: [5 - step, step, 1]} if step % 2 == 0 else {}
    line = _line(step, reward=step / 10, **extra)
    jsonl.write(line)
    viewers.write(line)
  viewers.close()
  _assert_same_as_jsonl(workdir)
  # Resumed from step 2's checkpoint: metrics.jsonl drops steps 3-5 and the rerun logs
  # different values there; TensorBoard must show the rerun's, each step once.
  jsonl = run_dir.MetricsWriter(workdir, resume_step=2)
  viewers = metric_writers.create(_settings(), workdir, resume_step=2)
  for step in range(3, 5):
    line = _line(step, reward=1 - step / 10, **({HIST: [0, 1, 6]} if step == 4 else {}))
    jsonl.write(line)
    viewers.write(line)
  viewers.close()
  lines = _assert_same_as_jsonl(workdir)
  assert [line["step"] for line in lines] == [0, 1, 2, 3, 4]
  assert lines[-1]["train/reward"] == pytest.approx(0.6)


def test_disabled_writers_write_nothing(tmp_path):
  for viewers in (metric_writers.create(_settings(), str(tmp_path), resume_step=None,
                                        enabled=False),
                  metric_writers.create(_settings(tensorboard=False), str(tmp_path),
                                        resume_step=None)):
    viewers.write(_line(1, 0.5))
    viewers.close()
  assert os.listdir(tmp_path) == []


@pytest.mark.slow("a training run and its resume, as subprocesses")
def test_training_run_and_its_resume_in_tensorboard(tmp_path):
  module = importlib.import_module("isojax.configs.hard")
  config = module.get_config("micro")
  config.update(num_steps=4, checkpoint_every=2)
  full = tmp_path / "full"
  train.run(config, str(full))
  lines = _assert_same_as_jsonl(full)
  assert [line["step"] for line in lines] == [0, 1, 2, 3, 4]
  assert any(HIST in line for line in lines)
  # The per-problem counts are in metrics.jsonl only: TensorBoard's one histogram is
  # the pass@1 histogram, and its scalars are the numbers (checked above).
  assert all(any(name in line for line in lines) for name in metrics.PER_PROBLEM_COUNTS)
  assert set(_read_tensorboard(full)[1]) == {HIST}
  # A crash after step 2's checkpoint: the rerun rewrites steps 3 and 4 (new wall_s).
  interrupted = tmp_path / "interrupted"
  shutil.copytree(full, interrupted)
  shutil.rmtree(interrupted / "checkpoints" / "4")
  train.run(config, str(interrupted))
  _assert_same_as_jsonl(interrupted)


class _FakeWandb(types.ModuleType):
  """Records what isojax asks of the wandb API."""

  def __init__(self):
    super().__init__("wandb")
    self.inits, self.logs, self.finished = [], [], 0

  def init(self, **kwargs):
    self.inits.append(kwargs)
    return self

  def log(self, data, step):
    self.logs.append((step, data))

  def finish(self):
    self.finished += 1

  class Histogram:
    def __init__(self, np_histogram):
      self.counts, self.edges = np_histogram


def test_wandb_logs_numbers_and_histograms_and_continues_its_run(tmp_path, monkeypatch):
  fake = _FakeWandb()
  monkeypatch.setitem(sys.modules, "wandb", fake)
  settings = _settings(tensorboard=False, wandb=True, wandb_project="p")
  workdir = str(tmp_path / "run_a")
  viewers = metric_writers.create(settings, workdir, resume_step=None, run_config={"seed": 0})
  viewers.write(_line(2, 0.5, **{HIST: [1, 3]}))
  viewers.close()
  (init,) = fake.inits
  assert init["project"] == "p" and init["name"] == "run_a" and init["config"] == {"seed": 0}
  assert init["dir"] == workdir and init["resume"] == "allow"
  ((step, data),) = fake.logs
  assert step == 2 and data["train/reward"] == 0.5 and data["rollouts"] == 64
  assert data[HIST].counts.tolist() == [1, 3]
  assert data[HIST].edges.tolist() == [-0.5, 0.5, 1.5]
  assert fake.finished == 1
  # A resume continues the same W&B run; a fresh start in the workdir begins a new one.
  metric_writers.create(settings, workdir, resume_step=2).close()
  metric_writers.create(settings, workdir, resume_step=None).close()
  ids = [i["id"] for i in fake.inits]
  assert ids[1] == ids[0] != ids[2]


def test_wandb_enabled_but_not_installed_is_a_clear_error(monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # what an uninstalled package looks like
  config = config_lib.base_config()
  config.num_steps = 2
  config.metric_writers.wandb = True
  with pytest.raises(ValueError, match=r"metric_writers.wandb=True.*pip install wandb"):
    config_lib.resolve(config)
  with pytest.raises(ImportError, match="pip install wandb"):
    metric_writers.create(config.metric_writers, "/nonexistent", resume_step=None)


def test_metric_writer_switches_must_be_booleans():
  config = config_lib.base_config()
  config.num_steps = 2
  config.metric_writers = ml_collections.ConfigDict(
      dict(config.metric_writers.to_dict(), tensorboard="yes"))
  with pytest.raises(ValueError, match="metric_writers.tensorboard='yes'"):
    config_lib.resolve(config)
