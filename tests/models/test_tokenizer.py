"""The tokenizer: byte-level BPE training, multi-EOS loading, BOS rules, and saving.

transformers is the reference for what a saved directory means: `AutoTokenizer` must
load it to the same ids, decoded text and chat rendering.
"""

import json
import os
import random

import numpy as np
import pytest

from isojax.models import chat_template
from isojax.models import tokenizer as tokenizer_lib

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
STRINGS = ["hello world", "What is seven plus eight?", "  leading and trailing  ",
           "café naïve 🙂 ünïcödé", "line one\nline two\n\n\ttab", "12+34=46", ""]


def _corpus(n=300):
  rng = random.Random(1)
  words = "the a cat dog hello world what is seven plus eight line one two café".split()
  return [" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) + rng.choice(".?!\n")
          for _ in range(n)]


@pytest.fixture(scope="module")
def qwen():
  return tokenizer_lib.train_bpe_tokenizer(
      _corpus(), vocab_size=400, special_tokens=QWEN_SPECIALS, eos="<|im_end|>",
      pad="<|endoftext|>", bos=None, chat_template=chat_template.QWEN_CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def llama():
  return tokenizer_lib.train_bpe_tokenizer(
      _corpus(), vocab_size=400, special_tokens=["<|begin_of_text|>", "<|eot_id|>"],
      eos="<|eot_id|>", pad="<|end_of_text|>", bos="<|begin_of_text|>", chat_template=None)


def test_bpe_specials_are_single_ids_and_first(qwen):
  ids = [qwen.tokenizer.token_to_id(t) for t in QWEN_SPECIALS]
  assert ids == [0, 1, 2]
  assert (qwen.eos_ids, qwen.pad_id, qwen.bos_id) == ((2,), 0, None)
  for token, i in zip(QWEN_SPECIALS, ids):
    assert qwen.encode(token) == [i]
  # matched whole inside text, never split into bytes
  ids = qwen.encode("<|im_start|>user\nhello<|im_end|>")
  assert ids[0] == 1 and ids[-1] == 2 and ids.count(1) == ids.count(2) == 1
  assert 256 + 3 < qwen.vocab_size <= 400  # bytes, specials, merges (as many as the corpus has)


def test_bpe_decode_round_trips(qwen):
  for s in STRINGS:
    assert qwen.decode(qwen.encode(s)) == s
  assert len(qwen.encode("hello world")) < len("hello world")  # merges were learned
  text = "<|im_start|>user\ncafé 🙂<|im_end|>"
  ids = qwen.encode(text)
  assert qwen.tokenizer.decode(ids, skip_special_tokens=False) == text
  assert qwen.decode(ids[:-1], skip_special_tokens=False) == text[:-len("<|im_end|>")]
  assert qwen.decode(ids) == "user\ncafé 🙂"


def test_bpe_rejects_a_vocabulary_too_small_for_the_bytes():
  with pytest.raises(ValueError, match="vocab_size 100"):
    tokenizer_lib.train_bpe_tokenizer(["x"], vocab_size=100, special_tokens=[], eos="<e>",
                                      pad="<p>")


def test_bos_prepended_unless_asked_not_to(llama):
  bos = llama.tokenizer.token_to_id("<|begin_of_text|>")
  assert llama.bos_id == bos
  assert llama.encode("hello") == [bos] + llama.encode("hello", add_bos=False)
  assert bos not in llama.encode("hello", add_bos=False)
  tokens, mask = llama.encode_batch_left_padded(["hello world", "a"])
  assert tokens.shape == mask.shape and tokens[:, -1].tolist() != [llama.pad_id] * 2
  assert (tokens[~mask] == llama.pad_id).all() and tokens[1, mask[1]][0] == bos


def _write_json(path, name, obj):
  with open(os.path.join(path, name), "w") as f:
    json.dump(obj, f)


def test_multi_eos_order_and_decode(tmp_path, qwen):
  qwen.tokenizer.save(str(tmp_path / "tokenizer.json"))
  a, b, c = (qwen.tokenizer.token_to_id(t) for t in ("a", "b", "c"))
  _write_json(tmp_path, "generation_config.json", {"eos_token_id": [a, b]})
  _write_json(tmp_path, "config.json", {"eos_token_id": c, "model_type": "qwen2",
                                        "bos_token_id": 0})
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert tok.eos_ids == (a, b, c) and tok.eos_id == a
  assert tok.pad_id == a and tok.bos_id is None  # no pad anywhere: the primary EOS
  hello = qwen.encode("hello")
  assert tok.decode(hello + [b] + hello) == "hello"
  assert tok.decode(hello + [c, a] + hello) == "hello"
  assert tok.decode(hello) == "hello"

  # tokenizer_config.json's eos_token ({"content"} form) and extra ids follow, deduplicated
  _write_json(tmp_path, "tokenizer_config.json",
              {"eos_token": {"content": "<|im_end|>", "special": True},
               "pad_token": "<|endoftext|>"})
  tok = tokenizer_lib.load_tokenizer(str(tmp_path), extra_stop_ids=(7, a, 2))
  assert tok.eos_ids == (a, b, c, 2, 7)
  assert tok.pad_id == 0  # tokenizer_config.json's pad_token
  assert tok.special_tokens == {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}

  _write_json(tmp_path, "generation_config.json", {"eos_token_id": [c, a], "pad_token_id": 1})
  tok = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert tok.eos_ids == (c, a, 2) and tok.pad_id == 1  # config pad wins


def test_load_errors_name_the_file(tmp_path, qwen):
  with pytest.raises(FileNotFoundError, match="tokenizer.json"):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  qwen.tokenizer.save(str(tmp_path / "tokenizer.json"))
  with pytest.raises(ValueError, match="no eos_token_id"):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  _write_json(tmp_path, "config.json", {"eos_token_id": "2"})
  with pytest.raises(ValueError, match=r"config\.json: eos_token_id is '2'"):
    tokenizer_lib.load_tokenizer(str(tmp_path))
  _write_json(tmp_path, "config.json", {"eos_token_id": 2})
  _write_json(tmp_path, "tokenizer_config.json", {"eos_token": "</s>"})
  with pytest.raises(ValueError, match=r"tokenizer_config\.json: eos_token '</s>' is not in"):
    tokenizer_lib.load_tokenizer(str(tmp_path))


def test_char_tokenizer_checkpoint_keeps_llama_bos_rule(tmp_path):
  tok = tokenizer_lib.build_char_tokenizer("0123456789+=")
  tok.save(str(tmp_path))
  _write_json(tmp_path, "config.json", {"model_type": "llama", "eos_token_id": 2,
                                        "bos_token_id": 1, "pad_token_id": 0})
  loaded = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert (loaded.eos_ids, loaded.pad_id, loaded.bos_id) == ((2,), 0, 1)
  assert loaded.encode("1+2=") == tok.encode("1+2=") == [1, 4, 13, 5, 14]
  assert loaded.decode(loaded.encode("1+2=3") + [2, 5]) == "1+2=3"
  # The layout written before tokenizer_config.json existed still loads.
  os.remove(tmp_path / "tokenizer_config.json")
  old = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert old.special_tokens == {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}
  assert old.encode("1+2=") == loaded.encode("1+2=") and old.chat_template is None


@pytest.mark.parametrize("kind", ["qwen", "llama", "char"])
def test_saved_dir_round_trips_through_autotokenizer(tmp_path, request, kind):
  transformers = pytest.importorskip("transformers")
  tok = (tokenizer_lib.build_char_tokenizer("abcdefghijklmnopqrstuvwxyz 0123456789+=?")
         if kind == "char" else request.getfixturevalue(kind))
  strings = ([s for s in STRINGS if set(s) <= set("helo wrd12+34=")] + ["what is 7+8?"]
             if kind == "char" else STRINGS)
  tok.save(str(tmp_path))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
  assert theirs.eos_token_id == tok.eos_id and theirs.pad_token_id == tok.pad_id
  assert theirs.special_tokens_map == tok.special_tokens
  for s in strings:
    ids = tok.encode(s, add_bos=False)
    assert theirs(s, add_special_tokens=False)["input_ids"] == ids
    if tok.bos_id is not None and kind != "char":  # the BPE's post-processor adds BOS
      assert theirs(s)["input_ids"] == tok.encode(s)
    assert theirs.decode(ids, skip_special_tokens=True) == tok.decode(ids) == s
  loaded = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert (loaded.eos_ids, loaded.pad_id) == (tok.eos_ids, tok.pad_id)
  assert loaded.special_tokens == tok.special_tokens
  assert loaded.chat_template == tok.chat_template
  assert all(loaded.encode(s, add_bos=False) == tok.encode(s, add_bos=False) for s in strings)
  if tok.chat_template is not None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "what is seven plus eight?"}]
    for add in (True, False):
      text = loaded.render_chat(messages, add_generation_prompt=add)
      assert text == tok.render_chat(messages, add_generation_prompt=add)
      assert text == theirs.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=add)
      assert loaded.encode(text, add_bos=False) == theirs.apply_chat_template(
          messages, tokenize=True, return_dict=False, add_generation_prompt=add)


def test_encode_batch_left_padded_unchanged():
  tok = tokenizer_lib.build_char_tokenizer("0123456789+=")
  tokens, mask = tok.encode_batch_left_padded(["1+2=", "12+3="], length=7)
  np.testing.assert_array_equal(tokens, [[0, 0, 1, 4, 13, 5, 14], [0, 1, 4, 5, 13, 6, 14]])
  np.testing.assert_array_equal(mask, tokens != 0)
  with pytest.raises(ValueError, match="more than the allowed 3"):
    tok.encode_batch_left_padded(["1+2="], length=3)


def _word_level(unk_in_vocab, pre_tokenizer):
  vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2} if unk_in_vocab else {"<pad>": 0, "<eos>": 1}
  vocab.update({w: len(vocab) + i for i, w in enumerate(["hello", "world"])})
  tok = tokenizer_lib.Tokenizer(tokenizer_lib.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizer
  return tokenizer_lib.TextTokenizer(tok, eos_id=1, pad_id=0, bos_id=None)


def test_chars_per_token_bounds_every_encoding(qwen, llama):
  """No text encodes to fewer than len(text) / chars_per_token ids (the bound that lets
  a prompt far over the limit be refused untokenized)."""
  rng = random.Random(0)
  texts = STRINGS + _corpus(50) + ["".join(rng.choice("ab 1+\n\té🙂") for _ in range(200))]
  chars = tokenizer_lib.build_char_tokenizer("0123456789+= \n")
  for tok, samples in ((qwen, texts), (llama, texts), (chars, ["12+34=46", "1 + 2\n" * 20])):
    most = tok.chars_per_token
    assert most == max(map(len, tok.tokenizer.get_vocab(with_added_tokens=True)))
    for text in samples + ["".join(tok.special_tokens.values()) * 3]:
      assert len(tok.encode(text, add_bos=False)) * most >= len(text), text


def test_no_bound_where_one_token_can_swallow_any_run_of_characters():
  split = tokenizer_lib.pre_tokenizers.WhitespaceSplit()
  assert _word_level(unk_in_vocab=True, pre_tokenizer=split).chars_per_token is None
  # WhitespaceSplit drops the spaces: "hello" + 10,000 spaces + "world" is two tokens.
  dropping = _word_level(unk_in_vocab=False, pre_tokenizer=split)
  assert dropping.chars_per_token is None
  assert dropping.encode_at_most("hello" + " " * 10_000 + "world", 2) is not None


def test_encode_at_most_refuses_a_long_text_without_tokenizing_it(qwen):
  calls = []
  text = "hello world " * 100_000

  class Recording:
    def __getattr__(self, name):
      return getattr(qwen.tokenizer, name)

    def encode(self, text, *args, **kwargs):
      calls.append(len(text))
      return qwen.tokenizer.encode(text, *args, **kwargs)

  tok = tokenizer_lib.TextTokenizer(Recording(), eos_ids=qwen.eos_ids, pad_id=qwen.pad_id,
                                    bos_id=qwen.bos_id)
  assert tok.encode_at_most(text, 1000) is None and not calls
  short = "hello world"
  assert tok.encode_at_most(short, 1000) == qwen.encode(short) and calls == [len(short)]
  exact = qwen.encode(short)
  assert tok.encode_at_most(short, len(exact)) == exact
  assert tok.encode_at_most(short, len(exact) - 1) is None
