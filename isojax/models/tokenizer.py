"""Text <-> token ids through the `tokenizers` library's `tokenizer.json`.

Real checkpoints (Qwen, Llama) ship a `tokenizer.json`; the tiny base model gets a
character-level one built here with the same library and saved in the same file, so
one loader serves both. Tests and small experiments that need a realistic tokenizer
without a download train a byte-level BPE here (`train_bpe_tokenizer`).

The loader also gathers what transformers spreads over three files: every
end-of-sequence id (instruct checkpoints stop at several: Llama 3 at
<|end_of_text|> and <|eot_id|>, Qwen2.5 at <|endoftext|> and <|im_end|>), the pad id,
the special-token strings and the chat template (rendered by `chat_template.py`).
`save` writes `tokenizer.json` and a `tokenizer_config.json` that
`transformers.AutoTokenizer` loads to the same ids and the same chat rendering.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Iterable, Sequence

import numpy as np
from tokenizers import (Regex, Tokenizer, decoders, models, pre_tokenizers, processors,
                        trainers)

from isojax.models import chat_template as chat_template_lib
from isojax.models import checkpoint_files
from isojax.models import gguf_checkpoint

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = chat_template_lib.TOKENIZER_CONFIG_FILE
PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
# The special-token names TextTokenizer keeps (transformers' chat templates see them).
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")
# transformers' "no limit" model_max_length (VERY_LARGE_INTEGER), for unknown limits.
_NO_LENGTH_LIMIT = int(1e30)


class TextTokenizer:
  """A thin wrapper that knows its special ids and chat template, and pads batches.

  `eos_ids` holds every id that ends a sequence; `eos_id` is the first (primary) one,
  the one written after SFT answers and given to the sampler.
  """

  def __init__(self, tokenizer: Tokenizer, *, eos_id: int | None = None,
               eos_ids: Sequence[int] = (), pad_id: int, bos_id: int | None,
               special_tokens: dict[str, str] | None = None,
               chat_template: str | None = None,
               chat_template_source: str = "<chat_template>",
               model_max_length: int | None = None):
    self.tokenizer = tokenizer
    self.eos_ids = _unique(([] if eos_id is None else [eos_id]) + list(eos_ids))
    if not self.eos_ids:
      raise ValueError("TextTokenizer: expected at least one end-of-sequence id")
    self.eos_id, self.pad_id, self.bos_id = self.eos_ids[0], int(pad_id), bos_id
    self.special_tokens = (dict(special_tokens) if special_tokens is not None
                           else self._special_tokens_from_ids())
    self.chat_template, self.chat_template_source = chat_template, chat_template_source
    self.model_max_length = model_max_length

  def _special_tokens_from_ids(self) -> dict[str, str]:
    # Directories saved before tokenizer_config.json existed name their tokens by id only.
    ids = {"bos_token": self.bos_id, "eos_token": self.eos_id, "pad_token": self.pad_id}
    return {name: self.tokenizer.id_to_token(i) for name, i in ids.items() if i is not None}

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_vocab_size()

  def encode(self, text: str, add_bos: bool = True) -> list[int]:
    """Token ids of `text`, after BOS when this tokenizer prepends one (Llama).

    Pass add_bos=False for text whose chat template already wrote `{{ bos_token }}`
    (transformers tokenizes rendered chats with add_special_tokens=False).
    """
    ids = self.tokenizer.encode(text, add_special_tokens=False).ids
    return ([self.bos_id] if add_bos and self.bos_id is not None else []) + ids

  def encode_at_most(self, text: str, max_tokens: int, add_bos: bool = True
                     ) -> list[int] | None:
    """`encode(text, add_bos)` if it is at most `max_tokens` ids long, else None.

    A text too long to fit is refused by its length alone, never tokenized: a
    50 MB row would otherwise take minutes (and gigabytes) to tokenize before
    being dropped. No token stands for more characters than `chars_per_token`,
    so a text longer than max_tokens * chars_per_token characters (after the
    normalizer, which may compose characters) cannot fit.
    """
    most = self.chars_per_token
    if most is not None and len(text) > max_tokens * most:
      normalizer = self.tokenizer.normalizer
      if normalizer is None or len(normalizer.normalize_str(text)) > max_tokens * most:
        return None
    ids = self.encode(text, add_bos=add_bos)
    return ids if len(ids) <= max_tokens else None

  @functools.cached_property
  def chars_per_token(self) -> int | None:
    """The most characters of (normalized) text one token can stand for: the longest
    entry of the vocabulary, as a byte-level token's characters each stand for a byte
    and a character is at least one. None (no bound) for a vocabulary with an unknown
    token that swallows a run of characters, or a pre-tokenizer that drops some."""
    model, tok = self.tokenizer.model, self.tokenizer
    unk = getattr(model, "unk_token", None)
    has_unk = unk is not None and tok.token_to_id(unk) is not None
    if isinstance(model, models.BPE):
      bounded = not has_unk or model.byte_fallback or not model.fuse_unk
    else:
      bounded = isinstance(model, models.WordLevel) and not has_unk
    probe = "a b\n\tc.  1+2=3 é!"
    if bounded and tok.pre_tokenizer is not None:
      pieces = tok.pre_tokenizer.pre_tokenize_str(probe)
      bounded = sum(end - start for _, (start, end) in pieces) == len(probe)
    if not bounded:
      return None
    return max(map(len, tok.get_vocab(with_added_tokens=True)), default=1)

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
    """Decodes up to (not including) the first of any EOS id; drops padding."""
    ids = [int(i) for i in ids]
    stops = set(self.eos_ids)
    end = next((k for k, i in enumerate(ids) if i in stops), len(ids))
    return self.tokenizer.decode([i for i in ids[:end] if i != self.pad_id],
                                 skip_special_tokens=skip_special_tokens)

  def encode_batch_left_padded(self, texts: Sequence[str],
                               length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns (tokens [G, P] int32, mask [G, P] bool), padded on the left."""
    encoded = [self.encode(t) for t in texts]
    longest = max(len(e) for e in encoded)
    length = length or longest
    if longest > length:
      raise ValueError(f"a prompt has {longest} tokens, more than the allowed {length}")
    return left_pad(encoded, length, self.pad_id)


  def render_chat(self, messages: list[dict], add_generation_prompt: bool = True,
                  **kwargs) -> str:
    """The prompt text of `messages` under this checkpoint's chat template."""
    if self.chat_template is None:
      raise ValueError(f"{self.chat_template_source}: no chat template; expected a "
                       f"`chat_template` in {TOKENIZER_CONFIG_FILE} or a "
                       f"{chat_template_lib.CHAT_TEMPLATE_FILE} file")
    return chat_template_lib.render(
        self.chat_template, messages, add_generation_prompt=add_generation_prompt,
        special_tokens=self.special_tokens, source=self.chat_template_source, **kwargs)

  def save(self, path: str) -> None:
    """Writes tokenizer.json and a tokenizer_config.json that AutoTokenizer loads."""
    os.makedirs(path, exist_ok=True)
    self.tokenizer.save(os.path.join(path, TOKENIZER_FILE))
    # PreTrainedTokenizerFast uses tokenizer.json as it is; a model-specific class
    # (Qwen2Tokenizer, ...) could rebuild the pipeline from vocab and merges.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **self.special_tokens,
              "model_max_length": self.model_max_length or _NO_LENGTH_LIMIT,
              # transformers would otherwise rewrite " ." as "." when decoding.
              "clean_up_tokenization_spaces": False}
    if self.chat_template is not None:
      config["chat_template"] = self.chat_template
    with open(os.path.join(path, TOKENIZER_CONFIG_FILE), "w", encoding="utf-8") as f:
      json.dump(config, f, indent=2, ensure_ascii=False)
    # A chat_template.jinja left in `path` would win over the config's template.
    jinja_file = os.path.join(path, chat_template_lib.CHAT_TEMPLATE_FILE)
    if self.chat_template is not None and os.path.isfile(jinja_file):
      with open(jinja_file, "w", encoding="utf-8") as f:
        f.write(self.chat_template)


def left_pad(rows: Sequence[Sequence[int]], length: int, pad_id: int
             ) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [G, P] int32, mask [G, P] bool) of id rows right-aligned in `length` slots."""
  tokens = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, ids in enumerate(rows):
    tokens[i, length - len(ids):] = ids
    mask[i, length - len(ids):] = True
  return tokens, mask


def _unique(ids: Iterable[int]) -> tuple[int, ...]:
  return tuple(dict.fromkeys(int(i) for i in ids))


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


def build_word_tokenizer(words: Sequence[str]) -> TextTokenizer:
  """One token per whitespace-separated word of `words`, after <pad>=0, <bos>=1, <eos>=2;
  decoding joins tokens with spaces."""
  vocab = {PAD: 0, BOS: 1, EOS: 2}
  for word in words:
    if not word or any(ch.isspace() for ch in word):
      raise ValueError(f"build_word_tokenizer: {word!r} is not one word")
    vocab.setdefault(word, len(vocab))
  tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tok.add_special_tokens([PAD, BOS, EOS])
  return TextTokenizer(tok, eos_id=vocab[EOS], pad_id=vocab[PAD], bos_id=vocab[BOS])


QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                       r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_bpe_tokenizer(texts: Iterable[str], *, vocab_size: int,
                        special_tokens: Sequence[str], eos: str, pad: str,
                        bos: str | None = None,
                        chat_template: str | None = None) -> TextTokenizer:
  """A byte-level BPE with Qwen2's pre-tokenizer, trained on `texts`.

  Special tokens (`special_tokens`, plus eos/pad/bos if not among them) get the first
  ids and are matched whole in text, so "<|im_start|>" in a rendered chat is one id.
  With `bos`, `encode` prepends it, as for Llama.
  """
  specials = list(dict.fromkeys([*special_tokens, eos, pad, *([bos] if bos else [])]))
  alphabet = pre_tokenizers.ByteLevel.alphabet()
  if vocab_size < len(alphabet) + len(specials):
    raise ValueError(f"train_bpe_tokenizer: vocab_size {vocab_size} is below the "
                     f"{len(alphabet)} byte tokens plus {len(specials)} special tokens")
  tok = Tokenizer(models.BPE())
  # Qwen2's pre-tokenizer: the split regex (one digit per piece, so numbers are
  # digit strings), then byte-level without GPT-2's own regex. transformers rebuilds
  # exactly this for any checkpoint whose config.json says model_type "qwen2".
  tok.pre_tokenizer = pre_tokenizers.Sequence([
      pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
      pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  # Every byte is in the alphabet, so no text is ever out of vocabulary.
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
      show_progress=False))
  ids = {t: tok.token_to_id(t) for t in specials}
  if bos:  # transformers' tok(text) then prepends BOS as our encode(text) does
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1", special_tokens=[(bos, ids[bos])])
  else:
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
  names = {"bos_token": bos, "eos_token": eos, "pad_token": pad}
  return TextTokenizer(tok, eos_id=ids[eos], pad_id=ids[pad],
                       bos_id=ids[bos] if bos else None,
                       special_tokens={k: v for k, v in names.items() if v is not None},
                       chat_template=chat_template,
                       chat_template_source="train_bpe_tokenizer(chat_template=...)")


def load_tokenizer(path: str, extra_stop_ids: Sequence[int] = ()) -> TextTokenizer:
  """Loads `path/tokenizer.json`; ids, special tokens and chat template beside it.

  A GGUF checkpoint's tokenizer, ids and template come from its metadata instead
  (`gguf_checkpoint.tokenizer_parts`).

  EOS ids, in order: generation_config.json's `eos_token_id` (an int or a list), then
  config.json's, then the id of tokenizer_config.json's `eos_token`, then
  `extra_stop_ids`; repeats dropped. The first is the primary `eos_id`.
  """
  gguf_file = gguf_checkpoint.find(path)
  if gguf_file is not None:
    parts = gguf_checkpoint.tokenizer_parts(gguf_checkpoint.open_file(gguf_file))
    return TextTokenizer(**{**parts, "eos_ids": [*parts["eos_ids"], *extra_stop_ids]})
  file = os.path.join(path, TOKENIZER_FILE)
  if not os.path.isfile(file):
    raise FileNotFoundError(f"{file}: missing; expected the checkpoint's tokenizer")
  try:
    tok = Tokenizer.from_file(file)
  except Exception as e:  # pylint: disable=broad-except  # the library raises plain Exception
    raise ValueError(f"{file}: the `tokenizers` library cannot read it ({e}); expected a "
                     "Hugging Face tokenizer.json") from None
  generation, config = (_read_json(path, n) or {}
                        for n in ("generation_config.json", "config.json"))
  tok_config = _read_json(path, TOKENIZER_CONFIG_FILE)
  config_file = os.path.join(path, TOKENIZER_CONFIG_FILE)
  special = _special_tokens(tok_config, config_file)
  eos_ids = [*_config_ids(generation, os.path.join(path, "generation_config.json")),
             *_config_ids(config, os.path.join(path, "config.json")),
             *([_token_id(tok, special, "eos_token", config_file)] if "eos_token" in special
               else []),
             *extra_stop_ids]
  if not eos_ids:
    raise ValueError(f"{path}: no eos_token_id in generation_config.json or config.json "
                     f"and no eos_token in {TOKENIZER_CONFIG_FILE}; expected at least one")
  merged = {**config, **generation}  # generation_config.json wins, as in transformers
  pad = merged.get("pad_token_id")
  if pad is None:
    pad = (_token_id(tok, special, "pad_token", config_file) if "pad_token" in special
           else eos_ids[0])
  template, source = chat_template_lib.load(path)
  return TextTokenizer(
      tok, eos_ids=eos_ids, pad_id=pad,
      bos_id=merged.get("bos_token_id") if _prepends_bos(merged) else None,
      # Without tokenizer_config.json (older tiny-model caches) the ids name the tokens.
      special_tokens=special if tok_config is not None else None,
      chat_template=template, chat_template_source=source,
      model_max_length=(tok_config or {}).get("model_max_length"))


def _read_json(path: str, name: str) -> dict | None:
  file = os.path.join(path, name)
  if not os.path.isfile(file):
    return None
  return checkpoint_files.read_json_object(file, f"a {name} (a JSON object)")


def _config_ids(config: dict, file: str) -> list[int]:
  """`eos_token_id` of a config, which is an int, a list of ints or absent."""
  value = config.get("eos_token_id")
  values = [] if value is None else value if isinstance(value, list) else [value]
  if not all(isinstance(v, int) for v in values):
    raise ValueError(f"{file}: eos_token_id is {value!r}; expected an int or a list of ints")
  return values


def _special_tokens(tok_config: dict | None, file: str) -> dict[str, str]:
  """tokenizer_config.json's bos/eos/pad/unk token strings (those that are set)."""
  found = {}
  for name in SPECIAL_TOKEN_NAMES:
    token = (tok_config or {}).get(name)
    if isinstance(token, dict):  # the serialised AddedToken form {"content": ...}
      token = token.get("content")
    if token is None:
      continue
    if not isinstance(token, str):
      raise ValueError(f"{file}: {name} is {token!r}; expected a string or {{\"content\": ...}}")
    found[name] = token
  return found


def _token_id(tok: Tokenizer, special: dict[str, str], name: str, file: str) -> int:
  token_id = tok.token_to_id(special[name])
  if token_id is None:
    raise ValueError(f"{file}: {name} {special[name]!r} is not in {TOKENIZER_FILE}'s "
                     "vocabulary; expected one of its tokens")
  return token_id


def _prepends_bos(config: dict) -> bool:
  # Llama prompts start with BOS; Qwen checkpoints set bos_token_id but never use it.
  return config.get("model_type") == "llama" and config.get("bos_token_id") is not None
