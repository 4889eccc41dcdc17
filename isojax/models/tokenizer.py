"""Text <-> token ids through the `tokenizers` library's `tokenizer.json`.

Real checkpoints (Qwen, Llama) ship a `tokenizer.json`; the tiny base model gets a
character-level one built here with the same library and saved in the same file, so
one loader serves both. Special-token ids come from the checkpoint's `config.json`
(`eos_token_id`, `bos_token_id`, `pad_token_id`) when present.
"""

from __future__ import annotations

import json
import os
from typing import Sequence

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

TOKENIZER_FILE = "tokenizer.json"
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


class TextTokenizer:
  """A thin wrapper that knows its special ids and pads batches."""

  def __init__(self, tokenizer: Tokenizer, *, eos_id: int, pad_id: int, bos_id: int | None):
    self.tokenizer = tokenizer
    self.eos_id, self.pad_id, self.bos_id = eos_id, pad_id, bos_id

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size()

  def encode(self, text: str) -> list[int]:
    ids = self.tokenizer.encode(text, add_special_tokens=False).ids
    return ([self.bos_id] if self.bos_id is not None else []) + ids

  def decode(self, ids: Sequence[int]) -> str:
    """Decodes up to (not including) the first EOS; drops padding."""
    ids = [int(i) for i in ids]
    if self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    return self.tokenizer.decode([i for i in ids if i != self.pad_id],
                                 skip_special_tokens=True)

  def encode_batch_left_padded(self, texts: Sequence[str],
                               length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns (tokens [G, P] int32, mask [G, P] bool), padded on the left."""
    encoded = [self.encode(t) for t in texts]
    longest = max(len(e) for e in encoded)
    length = length or longest
    if longest > length:
      raise ValueError(f"a prompt has {longest} tokens, more than the allowed {length}")
    tokens = np.full((len(texts), length), self.pad_id, np.int32)
    mask = np.zeros((len(texts), length), bool)
    for i, ids in enumerate(encoded):
      tokens[i, length - len(ids):] = ids
      mask[i, length - len(ids):] = True
    return tokens, mask

  def save(self, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    self.tokenizer.save(os.path.join(path, TOKENIZER_FILE))


def build_char_tokenizer(alphabet: str) -> TextTokenizer:
  """One token per character of `alphabet`, plus <pad>=0, <bos>=1, <eos>=2."""
  vocab = {PAD: 0, BOS: 1, EOS: 2}
  for ch in alphabet:
    vocab.setdefault(ch, len(vocab))
  tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tok.decoder = decoders.Fuse()
  tok.add_special_tokens([PAD, BOS, EOS])
  return TextTokenizer(tok, eos_id=vocab[EOS], pad_id=vocab[PAD], bos_id=vocab[BOS])


def load_tokenizer(path: str) -> TextTokenizer:
  """Loads `path/tokenizer.json`; special ids from `path/config.json`."""
  file = os.path.join(path, TOKENIZER_FILE)
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file}: missing; expected the checkpoint's tokenizer")
  tok = Tokenizer.from_file(file)
  config = {}
  for name in ("generation_config.json", "config.json"):
    if os.path.isfile(os.path.join(path, name)):
      with open(os.path.join(path, name)) as f:
        config = {**json.load(f), **config}
  eos = config.get("eos_token_id")
  if isinstance(eos, list):
    eos = eos[0]
  if eos is None:
    raise ValueError(f"{path}: config.json has no eos_token_id")
  pad = config.get("pad_token_id")
  return TextTokenizer(tok, eos_id=int(eos), pad_id=int(eos if pad is None else pad),
                       bos_id=config.get("bos_token_id") if _prepends_bos(config) else None)


def _prepends_bos(config: dict) -> bool:
  # Llama prompts start with BOS; Qwen checkpoints set bos_token_id but never use it.
  return config.get("model_type") == "llama" and config.get("bos_token_id") is not None
