"""Damaged checkpoint files are refused by their headers and sizes, naming file and tensor.

A tiny random-weight model is saved here, then cut or edited the ways partial copies
and hand edits damage a checkpoint; `check_files` (what a run calls before it touches
its workdir) and `load_model` must both name the file, and the tensor a truncation cut.
"""

import json
import os
import struct

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from isojax.models import checkpoint_files, hf_checkpoint
from isojax.models import tokenizer as tokenizer_lib
from isojax.models.transformer import ModelConfig, Transformer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """(directory, file bytes, header) of a saved 2-layer random model."""
  path = tmp_path_factory.mktemp("tiny") / "model"
  cfg = ModelConfig(vocab_size=19, num_layers=2, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=24)
  hf_checkpoint.save_model(Transformer(cfg, rngs=nnx.Rngs(0)), str(path), eos_token_id=1,
                           bos_token_id=0, pad_token_id=0)
  data = (path / "model.safetensors").read_bytes()
  (length,) = struct.unpack("<Q", data[:8])
  return path, data, json.loads(data[8:8 + length])


def _copy(saved, tmp_path, data=None):
  path, original, _ = saved
  out = tmp_path / "ckpt"
  out.mkdir()
  (out / "config.json").write_text((path / "config.json").read_text())
  (out / "model.safetensors").write_bytes(original if data is None else data)
  return out


def _refused(path, match):
  """Both the pre-run check and the loader raise `match` (a regex)."""
  for check in (hf_checkpoint.check_files, hf_checkpoint.load_model):
    with pytest.raises((ValueError, FileNotFoundError), match=match):
      check(str(path))


def _middle_tensor(saved):
  """(name, first byte in the file, size) of the tensor in the middle of the data."""
  _, data, header = saved
  tensors = sorted((info["data_offsets"][0], name, info["data_offsets"][1])
                   for name, info in header.items() if name != "__metadata__")
  begin, name, end = tensors[len(tensors) // 2]
  data_start = len(data) - max(e for _, _, e in tensors)
  return name, data_start + begin, end - begin


def test_the_saved_model_passes(saved):
  hf_checkpoint.check_files(str(saved[0]))


@pytest.mark.parametrize("cut", [0, 5])
def test_cut_inside_the_header_length(saved, tmp_path, cut):
  path = _copy(saved, tmp_path, saved[1][:cut])
  _refused(path, rf"{path}/model.safetensors: {cut} bytes, truncated inside the 8-byte "
                 "header length")


def test_cut_inside_the_json_header(saved, tmp_path):
  path = _copy(saved, tmp_path, saved[1][:100])
  _refused(path, rf"{path}/model.safetensors: truncated inside its JSON header: the header "
                 r"ends at byte \d+, the file at byte 100")


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_cut_inside_tensor_data_names_the_tensor(saved, tmp_path, where):
  _, data, header = saved
  if where == "middle":
    name, begin, size = _middle_tensor(saved)
    cut = begin + size // 2
  else:
    ordered = sorted((i["data_offsets"], n) for n, i in header.items() if n != "__metadata__")
    name = ordered[0 if where == "first" else -1][1]
    cut = len(data) - 1 if where == "last" else 8 + struct.unpack("<Q", data[:8])[0]
  path = _copy(saved, tmp_path, data[:cut])
  _refused(path, rf"{path}/model.safetensors: truncated inside tensor '{name}' \(F32, shape "
                 rf"\(\d+(, \d+|,)\)\): its data ends at byte \d+, the file at byte {cut}")


def _with_header(saved, tmp_path, edit):
  """The file with its header edited by `edit(header)` (the data unchanged)."""
  _, data, header = saved
  (length,) = struct.unpack("<Q", data[:8])
  header = json.loads(json.dumps(header))
  edit(header)
  text = json.dumps(header).encode()
  text += b" " * (-len(text) % 8)
  return _copy(saved, tmp_path, struct.pack("<Q", len(text)) + text + data[8 + length:])


def test_a_header_that_is_not_json(saved, tmp_path):
  _, data, _ = saved
  damaged = data[:20] + b"\x00" + data[21:]
  path = _copy(saved, tmp_path, damaged)
  _refused(path, rf"{path}/model.safetensors: the JSON header \(\d+ bytes\) does not parse")


def test_offsets_that_disagree_with_the_shape_name_the_tensor(saved, tmp_path):
  name = _middle_tensor(saved)[0]
  path = _with_header(saved, tmp_path, lambda h: h[name]["shape"].__setitem__(0, 3))
  _refused(path, rf"model.safetensors: tensor '{name}' \(F32, shape \(3, \d+\)\) is \d+ bytes, "
                 r"but its data_offsets \[\d+, \d+\] span \d+")


def test_a_dtype_isojax_does_not_read_names_the_tensor(saved, tmp_path):
  name = _middle_tensor(saved)[0]
  path = _with_header(saved, tmp_path, lambda h: h[name].update(dtype="F8_E4M3"))
  _refused(path, rf"model.safetensors: tensor '{name}' has dtype 'F8_E4M3'; expected one of")


def test_bytes_after_the_last_tensor_are_refused_by_the_library_naming_the_file(saved, tmp_path):
  path = _copy(saved, tmp_path, saved[1] + b"\x00" * 8)
  _refused(path, rf"{path}/model.safetensors: Error while deserializing header: .*; expected "
                 "a safetensors file")


def test_config_json_that_does_not_parse_names_file_line_and_column(saved, tmp_path):
  path = _copy(saved, tmp_path)
  (path / "config.json").write_text('{"model_type": "llama",\n "vocab_size": 19,,\n}')
  _refused(path, rf"{path}/config.json: not valid JSON \(line 2, column 19: Expecting "
                 "property name")


def test_a_directory_without_weights(saved, tmp_path):
  path = _copy(saved, tmp_path)
  os.remove(path / "model.safetensors")
  _refused(path, rf"{path}: no model.safetensors or model.safetensors.index.json")


def test_a_vocabulary_size_the_tensors_do_not_have_names_file_and_tensor(saved, tmp_path):
  path = _copy(saved, tmp_path)
  config = json.loads((path / "config.json").read_text())
  (path / "config.json").write_text(json.dumps(dict(config, vocab_size=23)))
  _refused(path, rf"{path}/model.safetensors: tensor '(model.embed_tokens|lm_head).weight' "
                 r"has shape \(19, 16\), expected \(23, 16\)")


def _shard(saved, tmp_path):
  """The model as two shards and an index; returns (directory, index, weight map)."""
  path = _copy(saved, tmp_path)
  tensors = load_file(str(path / "model.safetensors"))
  os.remove(path / "model.safetensors")
  names = sorted(tensors)
  weight_map = {}
  for i, part in enumerate((names[::2], names[1::2]), 1):
    file = f"model-0000{i}-of-00002.safetensors"
    save_file({n: tensors[n] for n in part}, str(path / file))
    weight_map.update(dict.fromkeys(part, file))
  index = path / checkpoint_files.WEIGHTS_INDEX
  index.write_text(json.dumps({"weight_map": weight_map}))
  return path, index, weight_map


def test_sharded_checkpoint_errors_name_the_index_or_the_shard(saved, tmp_path):
  path, index, weight_map = _shard(saved, tmp_path)
  hf_checkpoint.check_files(str(path))
  shard = path / "model-00002-of-00002.safetensors"
  data = shard.read_bytes()
  shard.write_bytes(data[:-10])
  _refused(path, rf"{shard}: truncated inside tensor '[\w.]+'")
  shard.write_bytes(data)
  name = sorted(weight_map)[0]
  index.write_text(json.dumps({"weight_map": dict(weight_map, **{name: shard.name})}))
  _refused(path, rf"{index}: lists tensor '{name}' in {shard.name}, whose header has no such")
  index.write_text(json.dumps({"weight_map": dict(weight_map, **{name: "missing.safetensors"})}))
  _refused(path, rf"{index}: tensor '{name}' is in missing.safetensors, but .* does not exist")
  index.write_text('{"weight_map": ')
  _refused(path, rf"{index}: not valid JSON \(line 1, column 16")


def test_a_tokenizer_json_that_does_not_parse_names_the_file(saved, tmp_path):
  path = _copy(saved, tmp_path)
  (path / "tokenizer.json").write_text('{"version": "1.0", "model": ')
  with pytest.raises(ValueError, match=rf"{path}/tokenizer.json: the `tokenizers` library "
                                       "cannot read it"):
    tokenizer_lib.load_tokenizer(str(path))


def test_header_reading_agrees_with_the_safetensors_library(saved):
  """Shapes, dtypes and bytes read through the checked header are the library's."""
  path = saved[0]
  infos = checkpoint_files.tensor_headers(str(path))
  reference = load_file(str(path / "model.safetensors"))
  assert sorted(infos) == sorted(reference)
  data = (path / "model.safetensors").read_bytes()
  for name, info in infos.items():
    got = np.frombuffer(data[info.offset:info.offset + info.nbytes], np.float32)
    np.testing.assert_array_equal(got.reshape(info.shape), reference[name])
