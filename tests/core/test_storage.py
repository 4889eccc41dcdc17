"""Run, split, sweep and analysis I/O through `isojax.storage`, on a local directory and
on a gs:// bucket (`fake_gcs` of conftest.py: an in-memory fsspec filesystem standing in
for gcsfs, which, like GCS, cannot append): the same code, the same files."""

import errno
import json
import os

import numpy as np
import pytest

from isojax import run_dir, storage
from isojax.config import config_lib
from isojax.planner import analysis, plots, synthetic
from isojax.sweeps import manifest as sweep_manifest
from isojax.tasks import splits
from isojax.tasks.problem import Problem


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path):
  if request.param == "local":
    return str(tmp_path)
  request.getfixturevalue("fake_gcs")
  return "gs://bucket/isojax"


def _line(step, value):
  return {"step": step, "rollouts": 16 * step, "tokens": 80 * step, "wall_s": 0.5 * step,
          "val/avg@4": value}


def test_paths_keep_uris_and_expand_local_ones():
  assert storage.absolute("gs://bucket/a/../b") == "gs://bucket/a/../b"
  assert storage.absolute("~/runs") == os.path.join(os.path.expanduser("~"), "runs")
  assert storage.absolute("runs/x") == os.path.join(os.getcwd(), "runs", "x")
  assert storage.is_uri("gs://b/x") and not storage.is_uri("/tmp/gs:x")
  assert os.fspath(storage.path("~/s") / "hard.json") == os.path.expanduser("~/s/hard.json")


def test_write_json_is_atomic_and_leaves_no_temporary_file(root):
  target = storage.path(root) / "sub" / "x.json"
  storage.write_json(target, {"a": np.float32(0.5), "b": np.arange(3), "c": [1, 2]})
  assert json.loads(target.read_text()) == {"a": 0.5, "b": [0, 1, 2], "c": [1, 2]}
  before = target.read_text()
  with pytest.raises(TypeError, match="not JSON serialisable: object"):
    storage.write_json(target, {"a": object()})
  assert target.read_text() == before  # the failed write changed nothing
  assert [p.name for p in target.parent.iterdir()] == ["x.json"]
  with pytest.raises(FileNotFoundError, match="missing.json: does not exist"):
    storage.read_json(storage.path(root) / "missing.json")
  (storage.path(root) / "bad.json").write_text("{nope")
  with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
    storage.read_json(storage.path(root) / "bad.json")


def test_a_full_disk_names_the_file_and_the_bytes_and_changes_nothing(tmp_path, monkeypatch):
  target = storage.path(tmp_path) / "metrics.jsonl"
  storage.write_text(target, "line 0\n")
  real = type(target).write_text

  def full(self, text, *args, **kwargs):
    real(self, text[:3])  # a partial temporary file, then the kernel's error
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(type(target), "write_text", full)
  text = "line 0\nline 1 é\n"
  with pytest.raises(storage.NoSpace) as error:
    storage.write_text(target, text)
  assert str(error.value).startswith(
      f"no space left on device writing {target}: it needs {len(text.encode()):,} bytes, ")
  assert "are free there" in str(error.value) and storage.is_no_space(error.value)
  monkeypatch.undo()
  assert target.read_text() == "line 0\n" and os.listdir(tmp_path) == ["metrics.jsonl"]
  assert storage.is_no_space(ValueError("Failed to write: [os_error_code='28']"))
  assert not storage.is_no_space(OSError(errno.EACCES, "Permission denied"))


def test_a_full_disk_while_appending_leaves_the_file_as_it_was(tmp_path, monkeypatch):
  target = tmp_path / "metrics.jsonl"
  storage.append_text(target, "line 0\n")
  real = os.write

  def full(fd, data):
    real(fd, data[:3])  # part of the line, then the kernel's error
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(os, "write", full)
  with pytest.raises(storage.NoSpace, match="it needs 10 bytes, .* are free there"):
    storage.append_text(target, "line 1 é\n")
  monkeypatch.undo()
  assert target.read_text() == "line 0\n"
  with pytest.raises(ValueError, match="cannot append"):
    storage.append_text("gs://bucket/metrics.jsonl", "x\n")


def test_local_metrics_grow_by_appending_never_by_rewriting(tmp_path, monkeypatch):
  records = [_line(step, step / 10) for step in range(5)]
  writer = run_dir.MetricsWriter(tmp_path)

  def no_rewrite(*_):
    raise AssertionError("rewrote the file")

  monkeypatch.setattr(storage, "write_text", no_rewrite)
  for record in records:
    writer.write(record)
  writer.flush()
  monkeypatch.undo()
  expected = "".join(json.dumps(r) + "\n" for r in records)
  assert (tmp_path / "metrics.jsonl").read_text() == expected
  assert run_dir.last_metrics(tmp_path) == records[-1]
  # The last line read from the end, however long the lines before and itself are.
  long_line = dict(_line(5, 0.5), counts=list(range(30000)))
  writer.write(long_line)
  event = dict(_line(5, 0.5), event="preempted", message="not a measurement")
  writer.write(event)
  assert run_dir.last_metrics(tmp_path) == long_line
  assert run_dir.last_line(tmp_path) == event
  assert run_dir.read_metrics(tmp_path)[-1] == long_line
  # A resume drops the lines after its step, then appends again.
  resumed = run_dir.MetricsWriter(tmp_path, resume_step=2)
  resumed.write(_line(3, 0.9))
  assert [(r["step"], r["val/avg@4"]) for r in run_dir.read_metrics(tmp_path)] == [
      (0, 0.0), (1, 0.1), (2, 0.2), (3, 0.9)]


def test_the_last_line_is_found_when_the_window_cuts_a_character(tmp_path):
  wide = json.dumps(dict(_line(0, 0.1), note="é" * 40000), ensure_ascii=False)
  for pad in ("", "x"):  # one of the two cuts a two-byte character in half
    last = dict(_line(1, 0.2), note=pad)
    (tmp_path / "metrics.jsonl").write_text(wide + "\n" + json.dumps(last) + "\n",
                                            encoding="utf-8")
    assert run_dir.last_metrics(tmp_path) == last


def test_a_damaged_last_line_is_a_format_error_naming_the_file(tmp_path):
  finished = json.dumps(_line(0, 0.1)) + "\n"
  for damaged in ('{"step": 1}\n', "[1, 2]\n"):
    (tmp_path / "metrics.jsonl").write_text(finished + damaged)
    with pytest.raises(run_dir.RunFormatError, match="metrics.jsonl:a line near its end"):
      run_dir.last_metrics(tmp_path)
    assert sweep_manifest.final_metrics(str(tmp_path), 1) is None
  (tmp_path / "metrics.jsonl").write_bytes(finished.encode() + b'{"a": "\xff"}\n')
  with pytest.raises(run_dir.RunFormatError, match="not UTF-8 near its end"):
    run_dir.last_metrics(tmp_path)


def test_readers_leave_out_a_line_whose_newline_is_not_written(tmp_path):
  finished = json.dumps(_line(0, 0.1)) + "\n"
  (tmp_path / "metrics.jsonl").write_text(finished + json.dumps(_line(1, 0.2))[:20])
  assert [r["step"] for r in run_dir.read_metrics(tmp_path)] == [0]
  # A file written by hand without its final newline keeps its last line.
  (tmp_path / "metrics.jsonl").write_text(finished + json.dumps(_line(1, 0.2)))
  assert [r["step"] for r in run_dir.read_metrics(tmp_path)] == [0, 1]
  # A broken line that is not the last is an error naming its line.
  (tmp_path / "metrics.jsonl").write_text("{nope\n" + finished)
  with pytest.raises(run_dir.RunFormatError, match="metrics.jsonl:1: not valid JSON"):
    run_dir.read_metrics(tmp_path)


def test_object_store_metrics_are_rewritten_at_most_every_interval_and_at_flush(fake_gcs):
  workdir = "gs://bucket/run"
  writer = run_dir.MetricsWriter(workdir, rewrite_every_s=3600.0)
  for step in range(3):
    writer.write(_line(step, step / 10))
  assert run_dir.read_metrics(workdir) == []  # not yet rewritten
  writer.flush()
  assert [r["step"] for r in run_dir.read_metrics(workdir)] == [0, 1, 2]
  # An event is written at once: a rerun does not log it again.
  writer.write(_line(3, 0.3))
  writer.write(dict(_line(3, 0.0), event="settings_changed", message="m"))
  assert [r["event"] for r in run_dir.read_events(workdir)] == ["settings_changed"]
  assert [r["step"] for r in run_dir.read_metrics(workdir)] == [0, 1, 2, 3]
  every_line = run_dir.MetricsWriter(workdir, resume_step=1)  # rewrite_every_s=0
  every_line.write(_line(2, 0.9))
  assert [(r["step"], r["val/avg@4"]) for r in run_dir.read_metrics(workdir)] == [
      (0, 0.0), (1, 0.1), (2, 0.9)]


def test_run_directory_round_trip(root):
  workdir = f"{root}/sweep/runs/bp4_n4"
  run_dir.write_config(workdir, {"problems_per_batch": 4, "rollouts_per_problem": 4})
  writer = run_dir.MetricsWriter(workdir)
  for step, value in enumerate([0.1, 0.2, 0.3, 0.4]):
    writer.write(_line(step, value))
  run = run_dir.load_run(workdir)
  assert run.config == {"problems_per_batch": 4, "rollouts_per_problem": 4}
  assert run.series("val/avg@4") == ([0.0, 16.0, 32.0, 48.0], [0.1, 0.2, 0.3, 0.4])
  # A resume at step 1 keeps lines 0 and 1, then appends (by rewriting) step 2 again.
  resumed = run_dir.MetricsWriter(workdir, resume_step=1)
  resumed.write(_line(2, 0.9))
  assert [(r["step"], r["val/avg@4"]) for r in run_dir.read_metrics(workdir)] == [
      (0, 0.1), (1, 0.2), (2, 0.9)]
  assert run_dir.last_metrics(workdir) == _line(2, 0.9)
  # find_runs skips checkpoint directories.
  storage.write_json(f"{root}/sweep/runs/bp4_n4/checkpoints/1/config.json", {})
  run_dir.write_config(f"{root}/sweep/runs/bp8_n2", {})
  assert run_dir.find_runs(f"{root}/sweep") == [f"{root}/sweep/runs/bp4_n4",
                                                f"{root}/sweep/runs/bp8_n2"]
  assert os.fspath(run_dir.checkpoint_dir(workdir)) == f"{workdir}/checkpoints"


def test_splits_configs_and_manifests(root):
  train = [Problem("1+2=", "3", 1), Problem("10+20=", "30", 2)]
  val = [Problem("3+4=", "7", 1)]
  splits.save_split(f"{root}/splits", "hard", train, val, {"1+2=": 0.0}, {"k": 16})
  assert splits.load_split(f"{root}/splits", "hard") == (train, val)
  assert splits.read_split_meta(f"{root}/splits", "hard") == dict(k=16, num_train=2,
                                                                  num_val=1)
  storage.write_json(f"{root}/plan.json", {"rollouts_per_problem": 2, "rl": {"kl_coef": 0.5}})
  config = config_lib.config_from_json(f"{root}/plan.json")
  assert (config.rollouts_per_problem, config.rl.kl_coef, config.problems_per_batch) == (
      2, 0.5, config_lib.base_config().problems_per_batch)
  assert sweep_manifest.read_manifest(f"{root}/sweep") is None
  sweep_manifest.write_manifest(f"{root}/sweep", {"name": "s", "runs": [{"name": "a"}]})
  manifest = sweep_manifest.read_manifest(f"{root}/sweep")
  assert manifest["runs"] == [{"name": "a"}] and manifest["name"] == "s"


def test_sweep_analysis_is_the_same_on_gs_as_on_local(tmp_path, fake_gcs):
  curves = synthetic.paper_like_curves([16], [2, 4, 8], n_saturation=4, c_mid_base=1e3)
  results = {}
  for where in (str(tmp_path / "local"), "gs://bucket/sweep"):
    synthetic.write_sweep(where, curves, budget_rollouts=1 << 16, num_evals=12, seed=3)
    written = analysis.write_analysis(analysis.analyze_directory(where),
                                      f"{where}/{analysis.ANALYSIS_FILE}")
    assert storage.read_json(f"{where}/{analysis.ANALYSIS_FILE}") == written
    for path in plots.write_plots(analysis.analyze_directory(where), where):
      assert storage.path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    results[where] = json.loads(json.dumps(written).replace(where, "ROOT"))
  local, gs = results.values()
  assert local == gs and len(local["fits"]) == 3
  assert "gs://bucket/sweep/analysis.json" in fake_gcs
  assert not [k for k in fake_gcs if k.endswith(".tmp")]
