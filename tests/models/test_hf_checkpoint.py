"""Our transformer reproduces Hugging Face logits for Llama, Qwen2 and Qwen3 checkpoints.

Random-weight models are built with `transformers`, saved to a temp dir, loaded with
`isojax.models.hf_checkpoint.load_model`, and compared on the same token batch.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top

COMMON = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
              rms_norm_eps=1e-6)


def _hf_model(kind, tie):
  torch.manual_seed(0)
  if kind == "llama":
    cfg = transformers.LlamaConfig(**COMMON, tie_word_embeddings=tie, rope_theta=500000.0,
                                   rope_scaling=dict(rope_type="llama3", factor=8.0,
                                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                                     original_max_position_embeddings=16))
    model = transformers.LlamaForCausalLM(cfg)
  elif kind == "qwen2":
    cfg = transformers.Qwen2Config(**COMMON, tie_word_embeddings=tie)
    model = transformers.Qwen2ForCausalLM(cfg)
  else:
    cfg = transformers.Qwen3Config(**COMMON, head_dim=24, tie_word_embeddings=tie)
    model = transformers.Qwen3ForCausalLM(cfg)
  with torch.no_grad():  # norms start at 1 and biases at 0; randomise them too
    for name, p in model.named_parameters():
      if "norm" in name or "bias" in name:
        p.add_(0.1 * torch.randn_like(p))
  return model.eval()


def _assert_same_logits(ours, hf, tokens):
  with torch.no_grad():
    expected = hf(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(np.asarray(ours(tokens, np.ones_like(tokens, bool))), expected,
                             atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("kind,tie", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_logits_match_transformers(tmp_path, kind, tie):
  hf = _hf_model(kind, tie)
  hf.save_pretrained(tmp_path, safe_serialization=True)
  ours = hf_checkpoint.load_model(str(tmp_path))

  rng = np.random.default_rng(0)
  tokens = rng.integers(0, COMMON["vocab_size"], size=(2, 11))
  with torch.no_grad():
    expected = hf(torch.tensor(tokens)).logits.numpy()
  got = np.asarray(ours(tokens, np.ones_like(tokens, bool)))
  np.testing.assert_allclose(got, expected, atol=2e-4, rtol=2e-4)


def test_left_padding_matches_unpadded(tmp_path):
  """A left-padded prompt gives the same logits on its real tokens as no padding."""
  hf = _hf_model("qwen2", True)
  hf.save_pretrained(tmp_path, safe_serialization=True)
  model = hf_checkpoint.load_model(str(tmp_path))
  tokens = np.arange(3, 10)[None]
  padded = np.concatenate([np.zeros((1, 4), int), tokens], axis=1)
  mask = padded != 0
  mask[:, :4] = False
  np.testing.assert_allclose(np.asarray(model(padded, mask))[:, 4:],
                             np.asarray(model(tokens, np.ones_like(tokens, bool))),
                             atol=1e-5, rtol=1e-5)


def test_save_then_load_round_trip_matches_transformers(tmp_path):
  """Our writer produces a directory transformers loads to the same logits."""
  hf = _hf_model("qwen3", True)
  hf.save_pretrained(tmp_path / "src", safe_serialization=True)
  ours = hf_checkpoint.load_model(str(tmp_path / "src"))
  hf_checkpoint.save_model(ours, str(tmp_path / "dst"), eos_token_id=1, bos_token_id=2,
                           pad_token_id=0)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "dst").eval()
  _assert_same_logits(ours, reloaded, np.arange(1, 9)[None])


def test_unsupported_model_type_names_the_file(tmp_path):
  (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
  with pytest.raises(ValueError, match="config.json.*gpt2"):
    hf_checkpoint.load_model(str(tmp_path))


def test_bfloat16_checkpoint_loads_its_exact_values(tmp_path):
  """Real checkpoints are bfloat16 (which safetensors' NumPy API cannot read)."""
  hf = _hf_model("qwen2", False).to(torch.bfloat16)
  hf.save_pretrained(tmp_path, safe_serialization=True)
  ours = hf_checkpoint.load_model(str(tmp_path))
  hf32 = hf.float()  # the same bfloat16 values, computed in float32 like ours
  _assert_same_logits(ours, hf32, np.arange(1, 12)[None])
  q_layer1 = hf32.model.layers[1].self_attn.q_proj.weight.detach().numpy().T
  np.testing.assert_array_equal(np.asarray(ours.layers.attn.q_proj.kernel[...][1]), q_layer1)


def test_sharded_checkpoint_with_index_loads(tmp_path):
  hf = _hf_model("llama", False)
  hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
  assert (tmp_path / hf_checkpoint.WEIGHTS_INDEX).exists()
  ours = hf_checkpoint.load_model(str(tmp_path))
  _assert_same_logits(ours, hf, np.arange(1, 9)[None])


def test_wrong_tensor_shape_names_tensor(tmp_path):
  hf = _hf_model("qwen3", False)
  hf.save_pretrained(tmp_path, safe_serialization=True)
  config = (tmp_path / "config.json").read_text().replace('"intermediate_size": 96',
                                                          '"intermediate_size": 80')
  (tmp_path / "config.json").write_text(config)
  with pytest.raises(ValueError, match=r"model.layers.0.mlp.\w+.weight' has shape "
                                       r"\((96, 64|64, 96)\), expected \((80, 64|64, 80)\)"):
    hf_checkpoint.load_model(str(tmp_path))
