"""The run-directory contract: writer, reader, resume truncation, clear errors."""

import os
import pytest

from isojax import run_dir


def _line(step, **kw):
  return dict(step=step, rollouts=step * 8, tokens=step * 40, wall_s=step * 1.5, **kw)


def test_round_trip_and_resume_truncation(tmp_path):
  w = run_dir.MetricsWriter(str(tmp_path))
  for s in range(5):
    w.write(_line(s, **{"val/avg@4": s / 10}))
  run_dir.write_config(str(tmp_path), {"rollouts_per_problem": 8})
  run = run_dir.load_run(str(tmp_path))
  assert run.series("val/avg@4") == ([0, 8, 16, 24, 32], [0, .1, .2, .3, .4])
  run_dir.MetricsWriter(str(tmp_path), resume_step=2)
  assert [r["step"] for r in run_dir.read_metrics(str(tmp_path))] == [0, 1, 2]


def test_writer_rejects_incomplete_record(tmp_path):
  with pytest.raises(ValueError, match="rollouts"):
    run_dir.MetricsWriter(str(tmp_path)).write({"step": 1})


def test_malformed_files_are_named(tmp_path):
  (tmp_path / "config.json").write_text("{not json")
  with pytest.raises(run_dir.RunFormatError, match="config.json"):
    run_dir.read_config(str(tmp_path))
  (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
  with pytest.raises(run_dir.RunFormatError, match=r"metrics.jsonl:1.*rollouts"):
    run_dir.read_metrics(str(tmp_path))
  assert isinstance(dict(run_dir.iter_loaded_runs([str(tmp_path)]))[str(tmp_path)],
                    run_dir.RunFormatError)


def test_find_runs_skips_checkpoints(tmp_path):
  for name in ("a", "b/c"):
    (tmp_path / name).mkdir(parents=True)
    (tmp_path / name / "config.json").write_text("{}")
  (tmp_path / "a" / "checkpoints" / "1").mkdir(parents=True)
  (tmp_path / "a" / "checkpoints" / "1" / "config.json").write_text("{}")
  assert run_dir.find_runs(str(tmp_path)) == [str(tmp_path / "a"), str(tmp_path / "b/c")]
  with pytest.raises(FileNotFoundError, match="nope"):
    run_dir.find_runs(str(tmp_path / "nope"))


def test_a_finished_run_keeps_its_newest_checkpoint_and_what_was_moved_aside(tmp_path):
  """Numeric steps compared as numbers (112 < 128, not as text); partial saves go;
  the damaged and superseded checkpoints stay for a person."""
  ckpt = run_dir.checkpoint_dir(str(tmp_path))
  for name in ("0", "16", "112", "128", "130.orbax-checkpoint-tmp-5", run_dir.CORRUPT_DIR,
               run_dir.SUPERSEDED_DIR):
    os.makedirs(os.path.join(ckpt, name, "inner"))
  assert run_dir.keep_the_last_checkpoint(str(tmp_path)) == ([0, 16, 112], 128)
  assert sorted(os.listdir(ckpt)) == sorted(["128", run_dir.CORRUPT_DIR,
                                             run_dir.SUPERSEDED_DIR])
  assert run_dir.keep_the_last_checkpoint(str(tmp_path)) == ([], 128)
  assert run_dir.keep_the_last_checkpoint(str(tmp_path / "no_run")) == ([], None)
