"""Builds, caches and loads the tiny base model for the built-in arithmetic task.

Nobody can download a base model in CI, so isojax makes one: a small transformer
trained by next-token supervised learning on addition problems, stopped early enough
that its pass rates spread from about 0 (many digits) to about 1 (few digits). It is
saved in the Hugging Face layout under `<cache_dir>/tiny-<hash of its settings>/` and
then loaded through `hf_checkpoint.load_model`, the path real checkpoints take.
The build is atomic (written to a temp dir, then renamed), so an interrupted build
never leaves a half-written model behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from isojax.models import hf_checkpoint
from isojax.models import tokenizer as tokenizer_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.tasks import arithmetic

BUILD_FILE = "isojax_build.json"
_BUILD_VERSION = 1  # bump when the recipe below changes


def _settings(base: ml_collections.ConfigDict, task: ml_collections.ConfigDict) -> dict:
  keys = ("num_layers", "embed_dim", "num_heads", "num_kv_heads", "head_dim", "mlp_dim",
          "sft_steps", "sft_batch_size", "sft_learning_rate", "sft_max_digits")
  return dict({k: base[k] for k in keys}, task=task.name, seed=task.seed,
              version=_BUILD_VERSION)


def cache_path(base: ml_collections.ConfigDict, task: ml_collections.ConfigDict) -> str:
  key = hashlib.sha256(json.dumps(_settings(base, task), sort_keys=True).encode()).hexdigest()
  return os.path.join(os.path.expanduser(base.cache_dir), f"tiny-{key[:12]}")


def _sft_batch(rng, tok, batch_size: int, max_digits: int, length: int):
  """Right-padded [bos] prompt answer [eos] sequences and a loss mask on the answer."""
  tokens = np.full((batch_size, length), tok.pad_id, np.int32)
  loss_mask = np.zeros((batch_size, length), np.float32)
  filled = 0
  while filled < batch_size:
    problem = arithmetic.sample_problem(rng, 1, max_digits)
    if arithmetic._is_validation(problem.prompt):  # pylint: disable=protected-access
      continue  # the base model never sees a validation problem
    prompt, answer = arithmetic.sft_text(problem)
    p_ids = tok.encode(prompt)
    a_ids = tok.encode(answer)[1 if tok.bos_id is not None else 0:] + [tok.eos_id]
    ids = p_ids + a_ids
    tokens[filled, :len(ids)] = ids
    loss_mask[filled, len(p_ids):len(ids)] = 1.0  # positions predicting answer tokens
    filled += 1
  return tokens, loss_mask


def train_base_model(base: ml_collections.ConfigDict, task: ml_collections.ConfigDict):
  """Supervised next-token training on addition; returns (model, tokenizer)."""
  tok = tokenizer_lib.build_char_tokenizer(arithmetic.ALPHABET)
  cfg = ModelConfig(vocab_size=tok.vocab_size, num_layers=base.num_layers,
                    embed_dim=base.embed_dim, num_heads=base.num_heads,
                    num_kv_heads=base.num_kv_heads, head_dim=base.head_dim,
                    mlp_dim=base.mlp_dim, tie_embeddings=True)
  model = Transformer(cfg, rngs=nnx.Rngs(task.seed))
  graphdef, params = nnx.split(model)
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, base.sft_learning_rate, warmup_steps=min(100, base.sft_steps // 10),
      decay_steps=base.sft_steps, end_value=base.sft_learning_rate * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.98))
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, tokens, loss_mask):
    def loss_fn(params):
      logits = nnx.merge(graphdef, params)(tokens[:, :-1], tokens[:, :-1] != tok.pad_id)
      logp = jax.nn.log_softmax(logits, axis=-1)
      nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
      mask = loss_mask[:, 1:]
      return (nll * mask).sum() / mask.sum()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  # The causal mask makes right padding harmless: padding only follows the answer.
  length = 3 * base.sft_max_digits + 5  # bos a + b = (a+b) eos
  rng = np.random.default_rng(task.seed)
  start = time.time()
  for i in range(base.sft_steps):
    batch = _sft_batch(rng, tok, base.sft_batch_size, base.sft_max_digits, length)
    params, opt_state, loss = step(params, opt_state, *batch)
    if (i + 1) % 250 == 0 or i + 1 == base.sft_steps:
      logging.info("base model SFT step %d/%d loss %.4f (%.0fs)", i + 1, base.sft_steps,
                   float(loss), time.time() - start)
  return nnx.merge(graphdef, params), tok


def ensure_base_model(base: ml_collections.ConfigDict, task: ml_collections.ConfigDict) -> str:
  """Returns the directory of the cached tiny base model, building it if needed."""
  path = cache_path(base, task)
  if os.path.isfile(os.path.join(path, BUILD_FILE)):
    return path
  logging.info("building the tiny base model into %s", path)
  model, tok = train_base_model(base, task)
  parent = os.path.dirname(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=".building-")
  try:
    hf_checkpoint.save_model(model, tmp, eos_token_id=tok.eos_id, bos_token_id=tok.bos_id,
                             pad_token_id=tok.pad_id)
    tok.save(tmp)
    with open(os.path.join(tmp, BUILD_FILE), "w") as f:
      json.dump(_settings(base, task), f, indent=2)
    try:
      os.replace(tmp, path)
    except OSError:  # another process finished the same build first
      if not os.path.isfile(os.path.join(path, BUILD_FILE)):
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return path
