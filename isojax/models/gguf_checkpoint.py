"""GGUF checkpoints (llama.cpp's single-file format) read as Hugging Face checkpoints.

A `.gguf` file, or a directory holding exactly one (and no `config.json`), is a
checkpoint `hf_checkpoint.load_model` and `tokenizer.load_tokenizer` read directly:
there is nothing to convert and nothing written beside the file. The `gguf` package
(llama.cpp's own reader) parses the file; this module maps it onto what a Hugging
Face directory would hold:

- `hf_config`: the config.json of the architecture, from the `<arch>.*` metadata
  (a tied head when the file has no `output.weight`, as llama.cpp writes it);
- `GGUFTensors`: each tensor under its Hugging Face name, dequantized to float32
  by `gguf.quants.dequantize`, with llama.cpp's reordering of Llama's q/k rows for
  its RoPE layout undone. A tensor is dequantized once and kept until the loader
  moves to the next parameter (`release`), so the host holds at most one stacked
  parameter in float32;
- `tokenizer`: the byte-level BPE of `tokenizer.ggml.*` (vocabulary, merges, control
  and user-defined tokens), its special ids and the chat template, built as
  transformers' GGUF loader builds them, so token ids agree with transformers'.

Why by hand: transformers' own GGUF loader needs torch and builds a torch model;
isojax reads the tensors straight into sharded JAX arrays.
"""

from __future__ import annotations

import functools
import glob
import os
from typing import Any

import numpy as np

SUFFIX = ".gguf"
# general.architecture -> config.json's model_type (the decoders isojax implements).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values

# GGUF tensor names (inside `blk.<i>.`) -> Hugging Face names (inside `model.layers.<i>.`).
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
                 "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}


def find(path: str) -> str | None:
  """The GGUF file behind checkpoint `path`, or None when `path` is a Hugging Face
  directory (it has a config.json, or no .gguf file)."""
  if os.path.isfile(path):
    return path if path.endswith(SUFFIX) else None
  if not os.path.isdir(path) or os.path.isfile(os.path.join(path, "config.json")):
    return None
  files = sorted(glob.glob(os.path.join(path, f"*{SUFFIX}")))
  if len(files) > 1:
    raise ValueError(f"{path}: holds {len(files)} GGUF files "
                     f"({', '.join(os.path.basename(f) for f in files)}); expected one: name "
                     "the file itself as base_model.path")
  return files[0] if files else None


def open_file(file: str) -> "GGUFFile":
  """The parsed file (metadata and tensor index; tensor data stays on disk), parsed
  once per version of the file (its size and modification time)."""
  stat = os.stat(file)
  return _open(os.path.abspath(file), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _open(file: str, size: int, mtime_ns: int) -> "GGUFFile":
  del size, mtime_ns  # the cache key: a rewritten file is parsed again
  return GGUFFile(file)


class GGUFFile:
  """A GGUF file's metadata, architecture and tensor index, checked on opening."""

  def __init__(self, file: str):
    import gguf  # pylint: disable=g-import-not-at-top
    self.file = file
    try:
      self._reader = gguf.GGUFReader(file, "r")
    except (ValueError, OSError, IndexError, KeyError) as e:
      size = os.path.getsize(file) if os.path.exists(file) else 0
      cut = _cut_tensor(file, size)
      if cut is not None:
        raise ValueError(f"{file}: truncated inside tensor {cut[0]!r}: its data ends at byte "
                         f"{cut[1]}, the file at byte {size}; expected the complete file"
                         ) from None
      raise ValueError(f"{file}: not a readable GGUF file ({size} bytes; {type(e).__name__}: "
                       f"{e}); expected a complete GGUF v2/v3 file, e.g. one written by "
                       "llama.cpp's convert_hf_to_gguf.py") from e
    self.architecture = self.field("general.architecture")
    if self.architecture not in ARCHITECTURES:
      raise ValueError(f"{file}: general.architecture={self.architecture!r}; isojax implements "
                       f"{sorted(ARCHITECTURES)}")
    self.tensors = {t.name: t for t in self._reader.tensors}
    self._check_complete()

  def field(self, key: str, default: Any = None) -> Any:
    """A metadata value (a scalar, a string or a list), `default` when absent."""
    f = self._reader.fields.get(key)
    return default if f is None else f.contents()

  def arch_field(self, key: str, default: Any = None) -> Any:
    return self.field(f"{self.architecture}.{key}", default)

  def _check_complete(self) -> None:
    """Every tensor's bytes lie inside the file (a truncated download fails here)."""
    size = os.path.getsize(self.file)
    for t in self._reader.tensors:
      if t.data_offset + t.n_bytes > size:
        raise ValueError(f"{self.file}: tensor {t.name!r} ends at byte "
                         f"{t.data_offset + t.n_bytes} but the file has {size}: truncated; "
                         "expected the complete file")
      if not can_dequantize(t.tensor_type):
        raise ValueError(f"{self.file}: tensor {t.name!r} is {t.tensor_type.name}, which "
                         "the gguf package cannot dequantize; expected F32, F16, BF16 or a "
                         "type gguf.quants implements (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K-Q6_K, ...)")

  def hf_config(self) -> dict[str, Any]:
    """The config.json a Hugging Face directory of this model would hold."""
    heads = self.arch_field("attention.head_count")
    embed = self.arch_field("embedding_length")
    missing = [k for k in ("block_count", "embedding_length", "feed_forward_length",
                           "attention.head_count") if self.arch_field(k) is None]
    if missing:
      raise ValueError(f"{self.file}: metadata lacks "
                       f"{', '.join(f'{self.architecture}.{k}' for k in missing)}")
    if "rope_freqs.weight" in self.tensors:
      raise ValueError(f"{self.file}: has rope_freqs.weight (per-dimension RoPE factors, as "
                       "Llama 3.1+ scaling is stored in GGUF), which isojax does not read; "
                       "use the Hugging Face checkpoint directory of this model")
    vocab = self.arch_field("vocab_size")
    if vocab is None:  # older files: the vocabulary's length (a long list to read)
      vocab = len(self.field("tokenizer.ggml.tokens") or [])
    head_dim = self.arch_field("attention.key_length") or embed // heads
    return dict(
        model_type=ARCHITECTURES[self.architecture],
        vocab_size=int(vocab),
        num_hidden_layers=int(self.arch_field("block_count")),
        hidden_size=int(embed),
        intermediate_size=int(self.arch_field("feed_forward_length")),
        num_attention_heads=int(heads),
        num_key_value_heads=int(self.arch_field("attention.head_count_kv") or heads),
        head_dim=int(head_dim),
        rope_theta=float(self.arch_field("rope.freq_base", 10000.0)),
        rms_norm_eps=float(self.arch_field("attention.layer_norm_rms_epsilon", 1e-6)),
        max_position_embeddings=int(self.arch_field("context_length", 4096)),
        tie_word_embeddings="output.weight" not in self.tensors,
        hidden_act="silu", attention_bias=False,
        bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
        eos_token_id=self.field("tokenizer.ggml.eos_token_id"))


def _cut_tensor(file: str, size: int) -> tuple[str, int] | None:
  """(name, end byte) of the first tensor whose data runs past the end of `file`, from
  its metadata alone (the gguf reader maps every tensor's data when it opens a file,
  and a cut file fails there with a reshape error naming no tensor); None when the
  metadata itself does not parse."""
  import gguf  # pylint: disable=g-import-not-at-top

  class _Extents(gguf.GGUFReader):
    """The reader's own parsing of the metadata; tensors measured, never mapped."""

    def _build_tensors(self, start_offs, fields):
      self.extents = []
      for field in fields:
        _, name, _, dims, raw_dtype, offset = field.parts
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(raw_dtype[0])]
        end = int(start_offs + offset[0]) + int(np.prod(dims)) * type_size // block
        self.extents.append((end, bytes(name).decode("utf-8")))

  try:
    extents = _Extents(file, "r").extents
  except Exception:  # pylint: disable=broad-except  # the metadata is cut or damaged
    return None
  return next(((name, end) for end, name in sorted(extents) if end > size), None)


@functools.cache
def can_dequantize(qtype) -> bool:
  """Whether `gguf.quants.dequantize` implements tensor type `qtype` (tried on one
  zero block: the package raises NotImplementedError for the types it lacks)."""
  from gguf import quants  # pylint: disable=g-import-not-at-top
  block, size = quants.GGML_QUANT_SIZES[qtype]
  try:
    quants.dequantize(np.zeros((size,), np.uint8), qtype)
  except (NotImplementedError, KeyError):
    return False
  return block >= 1


def hf_name(gguf_name: str) -> str | None:
  """The Hugging Face tensor name of a GGUF tensor, None for one with no counterpart."""
  if gguf_name in _GLOBAL_NAMES:
    return _GLOBAL_NAMES[gguf_name]
  parts = gguf_name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
  return None


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
  """Undoes llama.cpp's reordering of a Llama q/k projection's output rows.

  llama.cpp's converter interleaves the two halves of each head's rows (its RoPE
  pairs neighbouring dimensions, Hugging Face's Llama pairs the halves); this puts
  each head's rows back in Hugging Face's order: [heads, 2, d/2] <- [heads, d/2, 2].
  """
  rows = w.shape[0]
  return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(
      w.shape)


class GGUFTensors:
  """The tensors of a GGUF file under Hugging Face names, dequantized to float32.

  The interface of `hf_checkpoint`'s safetensors reader: `names`, `shape` and `read`
  of a block. A dequantized tensor is cached until `release()`.
  """

  def __init__(self, gguf_file: GGUFFile):
    self._file = gguf_file
    config = gguf_file.hf_config()
    self._heads = {"self_attn.q_proj": config["num_attention_heads"],
                   "self_attn.k_proj": config["num_key_value_heads"]}
    self._permuted = gguf_file.architecture == "llama"
    self._by_hf = {}
    for name in gguf_file.tensors:
      target = hf_name(name)
      if target is None:
        raise ValueError(f"{gguf_file.file}: tensor {name!r} has no place in a "
                         f"{gguf_file.architecture} model")
      self._by_hf[target] = name
    self._cache: dict[str, np.ndarray] = {}

  def names(self) -> list[str]:
    return list(self._by_hf)

  def file_of(self, name: str) -> str:
    del name  # one file holds every tensor
    return self._file.file

  def shape(self, name: str) -> tuple[int, ...]:
    # GGUF lists dimensions fastest-first ([in, out]); the Hugging Face layout is [out, in].
    return tuple(int(d) for d in reversed(self._file.tensors[self._by_hf[name]].shape))

  def release(self) -> None:
    self._cache.clear()

  def full(self, name: str) -> np.ndarray:
    """The whole tensor `name` (Hugging Face layout), float32."""
    if name not in self._cache:
      self._cache[name] = self._dequantize(name)
    return self._cache[name]

  def read(self, name: str, index: tuple[slice, ...], transpose: bool) -> np.ndarray:
    tensor = self.full(name)
    return np.asarray((tensor.T if transpose else tensor)[tuple(index)], np.float32)

  def _dequantize(self, name: str) -> np.ndarray:
    from gguf import quants  # pylint: disable=g-import-not-at-top
    t = self._file.tensors[self._by_hf[name]]
    try:
      w = quants.dequantize(np.asarray(t.data), t.tensor_type)
    except (NotImplementedError, ValueError) as e:
      raise ValueError(f"{self._file.file}: tensor {t.name!r} of type {t.tensor_type.name} "
                       f"could not be dequantized: {e}") from e
    w = np.asarray(w, np.float32).reshape(self.shape(name))
    for module, heads in self._heads.items():
      if self._permuted and name.endswith(f"{module}.weight"):
        w = unpermute_rope_rows(w, heads)
    return w


def tokenizer_parts(gguf_file: GGUFFile) -> dict[str, Any]:
  """What `tokenizer.TextTokenizer` needs, from `tokenizer.ggml.*` and the chat template.

  Only byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`: Llama 3, Qwen2.5,
  Qwen3, SmolLM2) are built; the pipeline is the one transformers' GGUF loader gives
  them: the split regex of a known `tokenizer.ggml.pre`, else GPT-2's byte-level
  pre-tokenizer, and control tokens matched whole.
  """
  from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
  f = gguf_file
  kind = f.field("tokenizer.ggml.model")
  if kind != "gpt2":
    raise ValueError(f"{f.file}: tokenizer.ggml.model={kind!r}; isojax builds byte-level BPE "
                     "vocabularies ('gpt2': Llama 3, Qwen2.5, Qwen3, SmolLM2) only")
  tokens = list(f.field("tokenizer.ggml.tokens") or [])
  merges = f.field("tokenizer.ggml.merges")
  if not tokens or not merges:
    raise ValueError(f"{f.file}: tokenizer.ggml.tokens / tokenizer.ggml.merges missing or "
                     "empty; expected a byte-level BPE vocabulary and its merges")
  token_types = list(f.field("tokenizer.ggml.token_type") or [0] * len(tokens))
  spelling = _bytes_to_unicode()
  alphabet = set(spelling.values())
  vocab = {(t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))): i
           for i, t in enumerate(tokens)}
  tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges],
                             fuse_unk=False, byte_fallback=False))
  split = _PRE_TOKENIZER_SPLITS.get(f.field("tokenizer.ggml.pre"))
  if split is None:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  else:
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                          for t, kind in zip(tokens, token_types)
                          if kind == _CONTROL and set(t) <= alphabet])
  tok.add_tokens([AddedToken(t, normalized=False, special=False)
                  for t, kind in zip(tokens, token_types) if kind == _USER_DEFINED and t in vocab])
  ids = {name: f.field(f"tokenizer.ggml.{key}") for name, key in (
      ("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id"))}
  if ids["eos_token"] is None:
    raise ValueError(f"{f.file}: no tokenizer.ggml.eos_token_id; expected the id that ends "
                     "a sequence")
  eos_ids = [ids["eos_token"], *(f.field(f"tokenizer.ggml.{k}") for k in ("eot_token_id",
                                                                            "eom_token_id"))]
  return dict(
      tokenizer=tok,
      eos_ids=[int(i) for i in eos_ids if i is not None],
      pad_id=int(ids["pad_token"] if ids["pad_token"] is not None else ids["eos_token"]),
      bos_id=(int(ids["bos_token"]) if f.field("tokenizer.ggml.add_bos_token", False)
              and ids["bos_token"] is not None else None),
      special_tokens={name: tokens[i] for name, i in ids.items() if i is not None},
      chat_template=f.field("tokenizer.chat_template"),
      chat_template_source=f"{f.file} (tokenizer.chat_template)",
      model_max_length=f.arch_field("context_length"))


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's printable spelling of each byte (the alphabet byte-level BPE tokens use)."""
  printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
               + list(range(ord("®"), ord("ÿ") + 1)))
  chars, extra = list(printable), 0
  for b in range(256):
    if b not in printable:
      printable.append(b)
      chars.append(256 + extra)
      extra += 1
  return dict(zip(printable, map(chr, chars)))


# tokenizer.ggml.pre -> the split regex its merges were learned with (transformers'
# GGUF loader's table, for the families isojax loads; others get GPT-2's).
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZER_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
                         "llama-bpe": _LLAMA3_SPLIT, "smaug-bpe": _LLAMA3_SPLIT,
                         "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
