"""End to end: `python -m isojax.main` on the micro preset, resume, and bad input."""

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from isojax import metrics, run_dir
from isojax.run import resume_check, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _micro(cache_dir, **overrides):
  module = importlib.import_module("isojax.configs.hard")
  config = module.get_config("micro")
  del cache_dir  # the shipped base model: nothing to build
  config.update(overrides)
  return config


def _main(*args, cwd=ROOT, env=None):
  return subprocess.run([sys.executable, "-m", "isojax.main", *args], cwd=cwd, env=env,
                        capture_output=True, text=True, timeout=300)


def test_main_micro_writes_the_run_directory(tmp_path):
  workdir = tmp_path / "run"
  home = tmp_path / "home"  # an empty home: no cache of any earlier run
  home.mkdir()
  proc = _main("--config=configs/hard.py:micro", f"--workdir={workdir}",
               env=dict(os.environ, HOME=str(home)))
  assert proc.returncode == 0, proc.stderr[-3000:]
  # Nothing is built or cached on a first run: the shipped base model is loaded.
  assert os.listdir(home) == [] and "SFT" not in proc.stderr
  config = json.loads((workdir / "config.json").read_text())
  n, b_p, m = config["rollouts_per_problem"], config["problems_per_batch"], config["num_steps"]
  assert config["budget_rollouts"] == n * b_p * m
  lines = run_dir.read_metrics(str(workdir))
  assert [r["step"] for r in lines] == list(range(m + 1))
  assert [r["rollouts"] for r in lines] == [s * n * b_p for s in range(m + 1)]
  tokens = [r["tokens"] for r in lines]
  assert tokens[0] == 0 and all(b > a for a, b in zip(tokens, tokens[1:]))
  # Each step generates between 1 and max_new_tokens tokens per rollout.
  assert n * b_p <= tokens[1] <= n * b_p * config["sampling"]["max_new_tokens"]
  evaluated = [r["step"] for r in lines if "val/avg@4" in r]
  assert evaluated == [0, 2, 3]
  # The memory plan's estimate, as the log gives it, is on step 0's line; XLA:CPU keeps no
  # allocator peak, so no step line has one.
  logged = re.search(r"estimated peak ([0-9.]+) GiB", proc.stderr).group(1)
  assert f"{lines[0][metrics.MEMORY_PLANNED]:.2f}" == logged
  assert not any(metrics.MEMORY_DEVICE_PEAK in r for r in lines)
  assert all(0 <= r["train/reward"] <= 1 for r in lines[1:])
  # Every step line carries its phase timings; the main thread's phases add up to it.
  for r in lines[1:]:
    phases = [r[f"time/{p}_s"] for p in ("sample", "grade_wait", "update", "other")]
    assert min(phases + [r["time/decode_s"], r["time/grade_s"]]) >= 0
    assert sum(phases) == pytest.approx(r["time/step_s"], abs=1e-6)
    assert r["time/decode_s"] > 0 and r["time/sample_s"] > 0 and r["time/update_s"] > 0
  assert [r["step"] for r in lines if "time/eval_s" in r] == [2, 3]
  assert os.path.isdir(workdir / "checkpoints" / str(m))


@pytest.mark.parametrize("slots", [(0, 0), (8, 2)], ids=["lockstep", "continuous"])
def test_resume_after_interruption_matches_uninterrupted_run(tmp_path, slots):
  """Also with continuous batching (`sampling.decode_slots`, halving to
  `decode_slots_min`) in training and evaluation, as the SmolLM2 study samples."""
  config = _micro(tmp_path / "cache", num_steps=4, checkpoint_every=2)
  config.sampling.decode_slots, config.sampling.decode_slots_min = slots
  full = tmp_path / "full"
  train.run(config, str(full))
  # Simulate a crash after step 2's checkpoint: drop the later checkpoint.
  interrupted = tmp_path / "interrupted"
  shutil.copytree(full, interrupted)
  shutil.rmtree(interrupted / "checkpoints" / "4")
  train.run(config, str(interrupted))
  strip = lambda lines: [run_dir.without_timings(r) for r in lines]
  assert strip(run_dir.read_metrics(str(interrupted))) == strip(run_dir.read_metrics(str(full)))


def test_resume_refuses_a_different_allocation(tmp_path):
  config = _micro(tmp_path / "cache", num_steps=2)
  train.run(config, str(tmp_path / "run"))
  with pytest.raises(ValueError, match="rollouts_per_problem"):
    train.run(_micro(tmp_path / "cache", num_steps=2, rollouts_per_problem=2),
              str(tmp_path / "run"))


def test_an_extension_trains_on_to_what_the_longer_run_computes(tmp_path):
  every = dict(schedule="linear", every=2, train_problems=0)
  short = _micro(None, num_steps=2, budget_rollouts=None)
  short.eval.update(every)
  extended = tmp_path / "extended"
  train.run(short, str(extended))
  long = _micro(None, num_steps=4, budget_rollouts=None)
  long.eval.update(every)
  with pytest.raises(resume_check.SettingsChanged, match="num_steps=2.*new --workdir"):
    train.run(long, str(extended))
  train.run(long, str(extended), allow_changed=["num_steps"])
  fresh = tmp_path / "fresh"
  train.run(long, str(fresh))
  strip = lambda lines: [run_dir.without_timings(r) for r in lines]
  assert strip(run_dir.read_metrics(str(extended))) == strip(run_dir.read_metrics(str(fresh)))
  history = run_dir.read_config_history(str(extended))
  assert history[-1]["step"] == 2 and history[-1]["changed"]["num_steps"] == {"old": 2,
                                                                              "new": 4}
  # Shorter is no extension.
  with pytest.raises(resume_check.SettingsChanged, match="an extension raises num_steps"):
    train.run(short, str(extended), allow_changed=["num_steps"])


def test_an_extension_may_evaluate_more_often_and_trains_the_same(tmp_path):
  """Where a run evaluates does not change what it trains: an extension that raises the
  evaluation count trains what the run planned at the old count computes."""
  def micro(num_steps, count):
    config = _micro(None, num_steps=num_steps, budget_rollouts=None)
    config.eval.update(schedule="log", count=count, train_problems=0)
    return config

  extended, fresh = tmp_path / "extended", tmp_path / "fresh"
  train.run(micro(2, 1), str(extended))
  train.run(micro(4, 4), str(extended), allow_changed=["num_steps", "eval.count"])
  train.run(micro(4, 1), str(fresh))
  lines = {name: run_dir.read_metrics(str(d)) for name, d in (("extended", extended),
                                                               ("fresh", fresh))}
  evaluated = {name: [r["step"] for r in v if "val/avg@4" in r] for name, v in lines.items()}
  # count 1: steps 0 and the end; count 4 past step 2: round(geomspace(1, 4, 4)) = 1, 2, 3, 4.
  assert evaluated == {"extended": [0, 2, 3, 4], "fresh": [0, 4]}
  trained = {name: [{k: x for k, x in run_dir.without_timings(r).items()
                     if k.startswith("train/")} for r in v if "train/loss" in r]
             for name, v in lines.items()}
  assert trained["extended"] == trained["fresh"] and len(trained["fresh"]) == 4


def _files(workdir):
  """config.json, metrics.jsonl and the checkpoint steps, as they are on disk."""
  return ((workdir / "config.json").read_text(), (workdir / "metrics.jsonl").read_text(),
          sorted(os.listdir(workdir / "checkpoints")))


def test_resume_with_changed_settings_is_refused_unless_allowed_and_recorded(tmp_path):
  lr = "optim.learning_rate"
  workdir = tmp_path / "run"
  first = _micro(None, num_steps=2)
  first.eval.train_problems = 0
  train.run(first, str(workdir))
  before = _files(workdir)
  old = json.loads(before[0])["optim"]["learning_rate"]

  def changed(**sections):
    config = _micro(None, num_steps=2)
    config.eval.train_problems = 0
    for section, fields in sections.items():
      config[section].update(fields)
    return config

  faster = changed(optim=dict(learning_rate=old * 10))
  with pytest.raises(resume_check.SettingsChanged) as refused:
    train.run(changed(optim=dict(learning_rate=old * 10), sampling=dict(temperature=1.0)),
              str(workdir))
  assert f"{lr} {old} -> {old * 10}" in str(refused.value)
  assert "sampling.temperature 0.6 -> 1.0" in str(refused.value)
  with pytest.raises(resume_check.SettingsChanged, match="model.lora.rank 0 -> 2"):
    train.run(changed(model=dict(lora=dict(rank=2))), str(workdir))
  # Refused before anything was written or moved.
  assert _files(workdir) == before
  assert not run_dir.config_history_path(str(workdir)).exists()

  train.run(faster, str(workdir), allow_changed=[lr])
  assert _files(workdir)[0] == before[0]  # config.json keeps the first values
  assert run_dir.read_config_history(str(workdir)) == [
      {"step": 2, "time": run_dir.read_config_history(str(workdir))[0]["time"],
       "changed": {lr: {"old": old, "new": old * 10}}}]
  (event,) = run_dir.read_events(str(workdir))
  assert event["event"] == metrics.EVENT_SETTINGS_CHANGED and event["step"] == 2
  assert event["changed"] == {lr: {"old": old, "new": old * 10}}
  # The allowed value is the run's from then on; the first one is now the change.
  train.run(faster, str(workdir))
  with pytest.raises(resume_check.SettingsChanged, match=f"{lr} {old * 10} -> {old}"):
    train.run(changed(), str(workdir))
  assert len(run_dir.read_config_history(str(workdir))) == 1


_FULL_DISK = """
import runpy, sys
import orbax.checkpoint as ocp
save = ocp.CheckpointManager.save

def full(self, step, *args, **kwargs):
  if step < 2:
    return save(self, step, *args, **kwargs)
  partial = self.directory / f"{step}.orbax-checkpoint-tmp-1" / "params"
  partial.mkdir(parents=True)
  raise ValueError('RESOURCE_EXHAUSTED: Error writing "w/0" in OCDBT database: Failed to '
                   "write 1049395 bytes to file 30: No space left on device "
                   "[os_error_code='28']")

ocp.CheckpointManager.save = full
sys.argv = ["isojax.main", *sys.argv[1:]]
runpy.run_module("isojax.main", run_name="__main__")
"""


def test_a_full_disk_during_a_save_ends_with_one_line_and_loses_nothing(tmp_path):
  workdir = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-c", _FULL_DISK, "--config=configs/hard.py:micro",
       f"--workdir={workdir}", "--config.num_steps=2", "--config.eval.train_problems=0"],
      cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))  # no restart
  assert proc.returncode == 1, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("isojax.main: error: no space left on device saving checkpoint "
                         f"step 2 to {workdir / 'checkpoints' / '2'}: it needs up to "), last
  assert "step 0, the newest whole one, is where a rerun resumes" in last
  assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
  # Nothing lost: the metrics of steps 0 to 2, checkpoint 0 whole, no partial directory.
  assert [r["step"] for r in run_dir.read_metrics(str(workdir))] == [0, 1, 2]
  assert os.listdir(workdir / "checkpoints") == ["0"]


@pytest.mark.parametrize("flag,message", [
    ("--config.rollouts_per_problem=0", "rollouts_per_problem"),
    ("--config.budget_rollouts=17", "budget_rollouts=17"),
    ("--config.rollouts_per_problem=1", "rollouts_per_problem=1"),
    ("--config.no_such_field=1", "no_such_field"),
    ("--allow_changed=optim.learning_rat", "optim.learning_rat (did you mean "
     "optim.learning_rate?)"),
])
def test_bad_input_fails_fast_and_writes_nothing(tmp_path, flag, message):
  workdir = tmp_path / "run"
  proc = _main("--config=configs/hard.py:micro", f"--workdir={workdir}", flag,
)
  assert proc.returncode != 0
  assert message in proc.stderr
  assert not workdir.exists()


def test_a_workdir_that_is_a_file_is_one_line_and_touches_nothing(tmp_path):
  for workdir, culprit in ((tmp_path / "afile", tmp_path / "afile"),
                           (tmp_path / "afile" / "run", tmp_path / "afile")):
    (tmp_path / "afile").write_text("mine\n")
    proc = _main("--config=configs/hard.py:micro", f"--workdir={workdir}")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1] == (
        f"isojax.main: error: --workdir={workdir}: {culprit} is a file; expected a "
        "directory")
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "afile").read_text() == "mine\n"


_FULL_AT_START = """
import errno, os, runpy, sys
pwrite = os.pwrite

def full(fd, data, offset):
  if os.readlink(f"/proc/self/fd/{fd}").endswith("run.lock"):
    raise OSError(errno.ENOSPC, "No space left on device")
  return pwrite(fd, data, offset)

os.pwrite = full
sys.argv = ["isojax.main", *sys.argv[1:]]
runpy.run_module("isojax.main", run_name="__main__")
"""


def test_a_disk_full_at_start_is_one_line_and_leaves_no_new_workdir(tmp_path):
  workdir = tmp_path / "new" / "run"
  proc = subprocess.run(
      [sys.executable, "-c", _FULL_AT_START, "--config=configs/hard.py:micro",
       f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, GLIBC_TUNABLES="glibc.malloc.hugetlb=0"))  # no restart
  assert proc.returncode == 1, proc.stderr[-3000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith("isojax.main: error: no space left on device writing the workdir "
                         f"lock {workdir / 'run.lock'}: it needs "), last
  assert last.endswith(f"{tmp_path / 'new'} was new and is removed"), last
  assert "Traceback" not in proc.stderr
  assert os.listdir(tmp_path) == []  # the directories it made are gone


@pytest.mark.slow("a micro run and its resume as subprocesses")
def test_a_damaged_metrics_line_stops_a_resume_before_anything_moves(tmp_path):
  """--resume_step=2 of a 4-step run whose metrics.jsonl has a damaged line: the error
  names the line and says to repair or delete it; checkpoint 4 is not moved aside and
  no settings history is written."""
  workdir = tmp_path / "run"
  proc = _main("--config=configs/hard.py:micro", f"--workdir={workdir}",
               "--config.num_steps=4", "--config.checkpoint_every=2")
  assert proc.returncode == 0, proc.stderr[-3000:]
  path = workdir / "metrics.jsonl"
  lines = path.read_text().splitlines(keepends=True)
  lines[1] = lines[1][:10] + "\n"
  path.write_text("".join(lines))
  before = sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*"))
  proc = _main("--config=configs/hard.py:micro", f"--workdir={workdir}",
               "--config.num_steps=4", "--config.checkpoint_every=2", "--resume_step=2")
  assert proc.returncode == 1
  last = proc.stderr.strip().splitlines()[-1]
  assert last.startswith(f"isojax.main: error: {path}:2: not valid JSON"), last
  assert last.endswith("repair or delete that line (nothing in the run directory was "
                       "changed)"), last
  assert sorted(str(p.relative_to(workdir)) for p in workdir.rglob("*")) == before
