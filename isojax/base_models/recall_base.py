"""The recall task's base model, constructed rather than trained (`launch.build_base`).

A one-layer Llama whose every next-token distribution is written down:

  embedding     token t is sqrt(D) times a one-hot vector: key i on dimension i, every
                answer token on one shared dimension, the special tokens on another
                (D = keys + 2), so the final RMSNorm passes it through unchanged;
  block         every attention and MLP weight is zero. The block then outputs zero, and
                its gradients are zero too (each projection's gradient is multiplied by
                another zero projection), so it stays zero under any optimizer: a fixed
                point, not a frozen layer;
  LM head       row d holds the logits of the tokens on dimension d, over sqrt(D):
                after key i, log p_i for its answer, log((1 - p_i) / (K - 1)) for each
                other answer token and `LOGIT_FLOOR` for every other token; after an
                answer, 0 for EOS and `LOGIT_FLOOR` for the rest.

So a key's logits depend on its own embedding row, norm weight and head row alone.
configs/recall.py freezes the embedding (`optim.frozen`): then a key's position has a
hidden state on its own dimension only, the gradient reaches its own norm weight and
head row only, and training one key moves no other key's distribution (the global
gradient-norm clip only rescales a step). Left trainable, a trained key's embedding
picks up every other dimension, and Adam, whose step is about the learning rate
whatever the gradient's size, then drags every other key's head row at random.
p_i = 2**-level holds at sampling temperature 1. The construction is exact arithmetic
on the settings, so every machine builds the same weights, unlike a trained base.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from isojax.base_models import tiny_base_model
from isojax.models import tokenizer as tokenizer_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.tasks import recall
from isojax.tasks.settings import TaskSettings

LOGIT_FLOOR = -30.0  # tokens the model never emits: e^-30 of the mass, next to nothing


def vocabulary(task: TaskSettings) -> list[str]:
  """The words after <pad>, <bos>, <eos>: every key, then every answer token."""
  return ([f"{recall.KEY_PREFIX}{i}" for i in range(recall.num_keys(task))]
          + [f"{recall.ANSWER_PREFIX}{j}" for j in range(task.recall_answers)])


def next_token_logits(task: TaskSettings, tok: tokenizer_lib.TextTokenizer) -> np.ndarray:
  """[keys + 2, V] float64: the logits after each key, after any answer, after a special
  token (uniform: never sampled from)."""
  keys, vocab = recall.num_keys(task), tok.vocab_size
  answer_ids = [tok.tokenizer.token_to_id(f"{recall.ANSWER_PREFIX}{j}")
                for j in range(task.recall_answers)]
  logits = np.full((keys + 2, vocab), LOGIT_FLOOR)
  for key, answer in enumerate(recall.answers_of_keys(task)):
    p = recall.base_pass_rate(recall.level_of_key(task, key))
    logits[key, answer_ids] = math.log((1.0 - p) / (task.recall_answers - 1))
    logits[key, answer_ids[answer]] = math.log(p)
  logits[keys, tok.eos_id] = 0.0
  logits[keys + 1] = 0.0
  return logits


def token_dimension(task: TaskSettings, tok: tokenizer_lib.TextTokenizer) -> np.ndarray:
  """[V] int: the embedding dimension of each token (see the module docstring)."""
  keys = recall.num_keys(task)
  dims = np.full(tok.vocab_size, keys + 1)
  for word in vocabulary(task):
    token = tok.tokenizer.token_to_id(word)
    dims[token] = (int(word[len(recall.KEY_PREFIX):]) if word.startswith(recall.KEY_PREFIX)
                   else keys)
  return dims


def construct(task: TaskSettings) -> tuple[Transformer, tokenizer_lib.TextTokenizer]:
  """The base model and its word-level tokenizer for `task`'s keys and answers."""
  recall.validate_model_fields(task)
  tok = tokenizer_lib.build_word_tokenizer(vocabulary(task))
  dim = recall.num_keys(task) + 2
  cfg = ModelConfig(vocab_size=tok.vocab_size, num_layers=1, embed_dim=dim, num_heads=1,
                    num_kv_heads=1, head_dim=4, mlp_dim=4, tie_embeddings=False)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  embedding = np.zeros((tok.vocab_size, dim), np.float32)
  embedding[np.arange(tok.vocab_size), token_dimension(task, tok)] = math.sqrt(dim)
  params = nnx.state(model, nnx.Param)
  params = jax.tree.map(lambda p: np.zeros(p.shape, np.float32), params)
  params["embed"]["embedding"] = embedding
  params["final_norm"]["weight"] = np.ones(dim, np.float32)
  params["lm_head"]["kernel"] = (next_token_logits(task, tok) / math.sqrt(dim)
                                 ).astype(np.float32)
  nnx.update(model, params)
  return model, tok


def build(task: TaskSettings, out_dir: str, command: str, name: str = "") -> dict[str, Any]:
  """Constructs the base model and writes it, with its manifest, to the new `out_dir`."""
  tiny_base_model.refuse_existing(out_dir)
  start = time.time()
  model, tok = construct(task)
  return tiny_base_model.save_built(model, tok, out_dir, task_name="recall", fields=dict(
      name=name or os.path.basename(os.path.normpath(out_dir)),
      task=dict(name="recall", **{f: getattr(task, f) for f in recall.MODEL_FIELDS}),
      build=dict(construction="recall_base", logit_floor=LOGIT_FLOOR, temperature=1.0),
      command=command, built_with=tiny_base_model.built_with(),
      build_seconds=round(time.time() - start, 1)))
