"""A run given a bad data file or a damaged checkpoint fails before its workdir is touched.

The error names the file and the line (data) or tensor (checkpoint); the workdir is
neither created nor, when it exists, locked or written (no config.json, no lock).
In-process `train.run` for each fault, and `python -m isojax.main` as a person runs it.
"""

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from isojax import run_dir
from isojax.base_models import demo_bases
from isojax.config import config_lib
from isojax.run import train, workdir_lock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = "".join(json.dumps(dict(question=f"What is {i} plus 1?", answer=f"#### {i + 1}")) + "\n"
               for i in range(8))


def _model(tmp_path, task_name="arithmetic"):
  """A copy of a shipped tiny model without its manifest: nothing checks its digests."""
  path = tmp_path / "model"
  shutil.copytree(demo_bases.shipped_dir(task_name), path)
  os.remove(path / demo_bases.MANIFEST_FILE)
  return path


def _micro(**task):
  config = config_lib.apply_preset(config_lib.apply_recipe(config_lib.base_config(), "hard"),
                                   "micro")
  config.task.update(task)
  return config


def _data_file(tmp_path, fault):
  """(path, the start of the message after the path) of a JSONL file with `fault`."""
  path = tmp_path / "train.jsonl"
  lines = ROWS.splitlines(keepends=True)
  content, message = {
      "empty": (b"", ": empty file (0 bytes); expected JSON Lines"),
      "malformed": ("".join(lines[:2] + ['{"question": "x", answer: 3}\n'] + lines[2:]).encode(),
                    ": line 3, column 19: not valid JSON"),
      "not_utf8": (ROWS.encode().replace(b"What is 3", b"Wh\xe9t is 3"),
                   ": line 4, byte 17: not UTF-8 text (byte 0xe9"),
      "binary": (b"\x1f\x8b\x08\x00" + bytes(range(256)), ": not a text file (a gzip file)"),
  }[fault]
  path.write_bytes(content)
  return path, message


def _damaged_model(tmp_path, fault):
  """(checkpoint path, the message naming its file and tensor) for `fault`."""
  path = _model(tmp_path)
  weights = path / "model.safetensors"
  data = weights.read_bytes()
  (length,) = struct.unpack("<Q", data[:8])
  header = json.loads(data[8:8 + length])
  first = min((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"])
  if fault == "no_safetensors":
    os.remove(weights)
    return path, f"{path}: no model.safetensors or model.safetensors.index.json"
  if fault == "vocab":
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, vocab_size=config["vocab_size"] + 1)))
    return path, f"{weights}: tensor '"
  if fault == "config_json":
    (path / "config.json").write_text('{"model_type": "llama",,}')
    return path, f"{path}/config.json: not valid JSON (line 1, column 24"
  cut = {"header_length": 5, "json_header": 8 + length // 2, "tensor_data": 8 + length + 100}
  weights.write_bytes(data[:cut[fault]])
  return path, {"header_length": f"{weights}: 5 bytes, truncated inside the 8-byte header length",
                "json_header": f"{weights}: truncated inside its JSON header",
                "tensor_data": f"{weights}: truncated inside tensor '{first}'"}[fault]


def _assert_untouched(workdir, before):
  if before is None:
    assert not workdir.exists()
  else:
    assert sorted(os.listdir(workdir)) == before
    assert not (workdir / run_dir.CONFIG_FILE).exists()
    assert not (workdir / workdir_lock.LOCK_FILE).exists()


def _existing_workdir(tmp_path, exists):
  workdir = tmp_path / "run"
  if not exists:
    return workdir, None
  workdir.mkdir()
  (workdir / "notes.txt").write_text("kept\n")
  return workdir, ["notes.txt"]


@pytest.mark.parametrize("exists", [False, True])
@pytest.mark.parametrize("fault", ["empty", "malformed", "not_utf8", "binary"])
def test_a_bad_data_file_fails_naming_its_line_before_the_workdir(tmp_path, fault, exists):
  path, message = _data_file(tmp_path, fault)
  config = _micro(name="math", format="gsm8k", train_files=str(path), num_val=2)
  config.base_model.path = str(_model(tmp_path, "reasoning_gym"))
  workdir, before = _existing_workdir(tmp_path, exists)
  with pytest.raises(ValueError) as raised:
    train.run(config, str(workdir))
  assert str(raised.value).startswith(f"{path}{message}"), raised.value
  _assert_untouched(workdir, before)


@pytest.mark.parametrize("exists", [False, True])
@pytest.mark.parametrize("fault", ["header_length", "json_header", "tensor_data",
                                   "no_safetensors", "vocab", "config_json"])
def test_a_damaged_checkpoint_fails_naming_file_and_tensor_before_the_workdir(tmp_path, fault,
                                                                              exists):
  path, message = _damaged_model(tmp_path, fault)
  config = _micro()
  config.base_model.path = str(path)
  workdir, before = _existing_workdir(tmp_path, exists)
  with pytest.raises((ValueError, FileNotFoundError)) as raised:
    train.run(config, str(workdir))
  assert str(raised.value).startswith(message), raised.value
  _assert_untouched(workdir, before)


def _main(*flags):
  return subprocess.run([sys.executable, "-m", "isojax.main", "--config=configs/hard.py:micro",
                         *flags], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["data", "checkpoint"])
def test_main_reports_the_file_and_leaves_no_workdir(tmp_path, kind):
  """As a person runs it: the last line of stderr names file and line or tensor."""
  workdir = tmp_path / "run"
  if kind == "data":
    path, message = _data_file(tmp_path, "malformed")
    message = f"{path}{message}"
    flags = ["--config.task.name=math", "--config.task.format=gsm8k",
             f"--config.task.train_files={path}", "--config.task.num_val=2",
             f"--config.base_model.path={_model(tmp_path, 'reasoning_gym')}"]
  else:
    path, message = _damaged_model(tmp_path, "tensor_data")
    flags = [f"--config.base_model.path={path}"]
  proc = _main(f"--workdir={workdir}", *flags)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert message in last, proc.stderr[-3000:]
  assert not workdir.exists()
  # A named file's fault is one line; its traceback on request.
  assert "Traceback" not in proc.stderr and last.startswith("isojax.main: error: ")
  if kind == "data":
    verbose = _main(f"--workdir={workdir}", "--verbosity=1", *flags)
    assert "Traceback" in verbose.stderr
    assert f"isojax.main: error: {message}" in verbose.stderr
