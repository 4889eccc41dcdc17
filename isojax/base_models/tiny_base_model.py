"""Builds the tiny base models of the embedded demos (`launch.build_base` runs it).

Nobody can download a base model in CI, so isojax ships two it built: small
transformers trained by next-token supervised learning, stopped early enough that
their pass rates spread from about 0 to about 1. Two demos:

  arithmetic     a character tokenizer and "12+34=" -> "46" (the default task);
  reasoning_gym  the path a real instruct checkpoint takes: a byte-level BPE tokenizer
                 trained here with `tokenizers`, a Qwen-style chat template in its
                 tokenizer_config.json, two end-of-sequence ids (<|im_end|> and
                 <|endoftext|>) in generation_config.json, a Qwen2-architecture model
                 (qkv bias), and SFT on chat-rendered reasoning-gym problems with short
                 worked rationales.

Runs load the shipped directories (`demo_bases`); this module only writes new ones.
SFT is chaotic in float rounding: the same settings on another CPU, jax version or
XLA build end in another model, which is why the demos ship the model and not the
recipe. A directory is written in the Hugging Face layout with a `demo_bases`
manifest (file hashes, architecture, build settings, the command), atomically
(a temp dir, then a rename), so an interrupted build leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from flax import nnx

from isojax import cpu_isa, tasks
from isojax.base_models import demo_bases
from isojax.models import chat_template as chat_template_lib
from isojax.models import hf_checkpoint
from isojax.models import tokenizer as tokenizer_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.tasks import arithmetic, prompts, reasoning_gym_task
from isojax.tasks.settings import TaskSettings

# The demo BPE: Qwen's special tokens; <|im_end|> ends a turn, <|endoftext|> pads.
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_BPE_VOCAB = 640
DEMO_TASKS = ("arithmetic", "reasoning_gym")
TOKENIZER_KINDS = {"arithmetic": "characters", "recall": "words"}


@dataclasses.dataclass(frozen=True)
class BuildSettings:
  """What a demo base model build computes with (recorded in its manifest)."""
  num_layers: int = 2
  embed_dim: int = 128
  num_heads: int = 4
  num_kv_heads: int = 2
  head_dim: int = 32
  mlp_dim: int = 384
  sft_steps: int = 600
  sft_batch_size: int = 64
  sft_learning_rate: float = 3e-3
  sft_max_digits: int = 3      # arithmetic: operands of 1 to this many digits
  seed: int = 1234             # initialisation and the order of the SFT data

  def validate(self) -> None:
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if field.name != "seed" and not value > 0:
        raise ValueError(f"build setting {field.name}={value}: expected a positive value")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"build setting num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")


def task_settings(task: TaskSettings) -> dict[str, Any]:
  """The task fields a build's SFT data and prompts depend on (its manifest's `task`)."""
  out = dict(name=task.name)
  if task.name == "reasoning_gym":
    out.update(dataset=task.dataset, dataset_kwargs=reasoning_gym_task.dataset_kwargs(task),
               seed=task.seed, num_train=task.num_train, num_val=task.num_val,
               system_prompt=task.system_prompt, instruction=task.instruction,
               bpe_vocab=_BPE_VOCAB)
  return out


def _sft_batch(rng, tok, batch_size: int, max_digits: int, length: int):
  """Right-padded [bos] prompt answer [eos] sequences and a loss mask on the answer."""
  tokens = np.full((batch_size, length), tok.pad_id, np.int32)
  loss_mask = np.zeros((batch_size, length), np.float32)
  filled = 0
  while filled < batch_size:
    problem = arithmetic.sample_problem(rng, 1, max_digits)
    if arithmetic.is_validation(problem.prompt):
      continue  # the base model never sees a validation problem
    prompt, answer = arithmetic.sft_text(problem)
    p_ids = tok.encode(prompt)
    a_ids = tok.encode(answer)[1 if tok.bos_id is not None else 0:] + [tok.eos_id]
    ids = p_ids + a_ids
    tokens[filled, :len(ids)] = ids
    loss_mask[filled, len(p_ids):len(ids)] = 1.0  # positions predicting answer tokens
    filled += 1
  return tokens, loss_mask


def _example_batch(rng, examples: list[tuple[list[int], list[int]]], batch_size: int,
                   length: int, pad_id: int):
  """Right-padded (prompt + target) rows of random examples and a loss mask on targets."""
  tokens = np.full((batch_size, length), pad_id, np.int32)
  loss_mask = np.zeros((batch_size, length), np.float32)
  for row, i in enumerate(rng.integers(0, len(examples), batch_size)):
    prompt, target = examples[i]
    tokens[row, :len(prompt) + len(target)] = prompt + target
    loss_mask[row, len(prompt):len(prompt) + len(target)] = 1.0
  return tokens, loss_mask


def _reasoning_gym_data(task: TaskSettings):
  """(BPE tokenizer with a chat template, [(prompt ids, target ids)]) from train problems.

  Prompts are rendered exactly as the RL loop renders them (`tasks.prompts`), so the
  base model is supervised on the prompts it will later be sampled on.
  """
  train = reasoning_gym_task.load(task).train  # never the validation problems
  instruction = tasks.default_instruction(task)
  messages = lambda p: ([{"role": "system", "content": task.system_prompt}]
                        if task.system_prompt else []) + [
                            {"role": "user", "content": prompts.user_text(p, instruction)}]
  template = chat_template_lib.QWEN_CHAT_TEMPLATE
  render = lambda p: chat_template_lib.render(template, messages(p),
                                              special_tokens={"eos_token": "<|im_end|>"})
  texts = [render(p) + reasoning_gym_task.sft_target(p) for p in train]
  tok = tokenizer_lib.train_bpe_tokenizer(
      texts, vocab_size=_BPE_VOCAB, special_tokens=_SPECIAL_TOKENS, eos="<|im_end|>",
      pad="<|endoftext|>", chat_template=template)
  examples = []
  for p in train:
    prompt_text, add_bos = prompts.render(p, tok, fmt="chat", system_prompt=task.system_prompt,
                                          instruction=instruction)
    target = tok.encode(reasoning_gym_task.sft_target(p), add_bos=False) + [tok.eos_id]
    examples.append((tok.encode(prompt_text, add_bos=add_bos), target))
  return tok, examples


def _supervised(cfg: ModelConfig, next_batch: Callable, base: BuildSettings,
                pad_id: int) -> Transformer:
  """Next-token training on the masked targets of `next_batch(rng)` batches."""
  model = Transformer(cfg, rngs=nnx.Rngs(base.seed))
  graphdef, params = nnx.split(model)
  schedule = optax.warmup_cosine_decay_schedule(
      0.0, base.sft_learning_rate, warmup_steps=min(100, base.sft_steps // 10),
      decay_steps=base.sft_steps, end_value=base.sft_learning_rate * 0.1)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, b2=0.98))
  opt_state = optimizer.init(params)

  @jax.jit
  def step(params, opt_state, tokens, loss_mask):
    def loss_fn(params):
      logits = nnx.merge(graphdef, params)(tokens[:, :-1], tokens[:, :-1] != pad_id)
      logp = jax.nn.log_softmax(logits, axis=-1)
      nll = -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
      mask = loss_mask[:, 1:]
      return (nll * mask).sum() / mask.sum()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  # The causal mask makes right padding harmless: padding only follows the target.
  rng = np.random.default_rng(base.seed)
  start = time.time()
  for i in range(base.sft_steps):
    params, opt_state, loss = step(params, opt_state, *next_batch(rng))
    if (i + 1) % 250 == 0 or i + 1 == base.sft_steps:
      logging.info("base model SFT step %d/%d loss %.4f (%.0fs)", i + 1, base.sft_steps,
                   float(loss), time.time() - start)
  return nnx.merge(graphdef, params)


def train_base_model(base: BuildSettings, task: TaskSettings):
  """Supervised next-token training for the task's demo; returns (model, tokenizer)."""
  base.validate()
  dims = dict(num_layers=base.num_layers, embed_dim=base.embed_dim, num_heads=base.num_heads,
              num_kv_heads=base.num_kv_heads, head_dim=base.head_dim, mlp_dim=base.mlp_dim,
              tie_embeddings=True)
  if task.name == "arithmetic":
    tok = tokenizer_lib.build_char_tokenizer(arithmetic.ALPHABET)
    length = 3 * base.sft_max_digits + 5  # bos a + b = (a+b) eos
    next_batch = lambda rng: _sft_batch(rng, tok, base.sft_batch_size, base.sft_max_digits,
                                        length)
    cfg = ModelConfig(vocab_size=tok.vocab_size, **dims)
  elif task.name == "reasoning_gym":
    tok, examples = _reasoning_gym_data(task)
    length = max(len(p) + len(t) for p, t in examples)
    next_batch = lambda rng: _example_batch(rng, examples, base.sft_batch_size, length,
                                            tok.pad_id)
    cfg = ModelConfig(vocab_size=tok.vocab_size, qkv_bias=True, **dims)  # Qwen2-shaped
  else:
    raise ValueError(f"task.name={task.name!r}: isojax builds a tiny base model only for "
                     f"{list(DEMO_TASKS)}")
  return _supervised(cfg, next_batch, base, tok.pad_id), tok


def write_model(model: Transformer, tok: tokenizer_lib.TextTokenizer, directory: str,
                task_name: str) -> None:
  """The Hugging Face files of a demo model: config, weights, tokenizer, stop ids."""
  hf_checkpoint.save_model(model, directory, eos_token_id=tok.eos_id,
                           bos_token_id=tok.pad_id if tok.bos_id is None else tok.bos_id,
                           pad_token_id=tok.pad_id)
  tok.save(directory)
  if task_name == "reasoning_gym":  # an instruct checkpoint's several stop ids
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
      json.dump(dict(eos_token_id=[tok.eos_id, tok.pad_id], pad_token_id=tok.pad_id,
                     bos_token_id=tok.pad_id), f, indent=2)


def built_with() -> dict[str, str]:
  """The software and machine a build ran on: SFT's result depends on all of them."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  return dict(jax=jax.__version__, jaxlib=jaxlib.__version__, cpu=cpu_isa.cpu_model(),
              isa=cpu_isa.effective_isa(), xla_flags=os.environ.get("XLA_FLAGS", ""))


def build(base: BuildSettings, task: TaskSettings, out_dir: str,
          command: str, name: str = "") -> dict[str, Any]:
  """Trains a demo base model and writes it, with its manifest, to the new `out_dir`.

  Refuses an existing `out_dir` (nothing written is replaced). Returns the manifest.
  """
  refuse_existing(out_dir)
  start = time.time()
  model, tok = train_base_model(base, task)
  return save_built(model, tok, out_dir, task_name=task.name, fields=dict(
      name=name or os.path.basename(os.path.normpath(out_dir)), task=task_settings(task),
      build=dataclasses.asdict(base), command=command, built_with=built_with(),
      build_seconds=round(time.time() - start, 1)))


def refuse_existing(out_dir: str) -> None:
  if os.path.exists(out_dir):
    raise FileExistsError(f"{out_dir}: already exists; the builder writes a new directory")


def save_built(model: Transformer, tok: tokenizer_lib.TextTokenizer, out_dir: str, *,
               task_name: str, fields: dict[str, Any]) -> dict[str, Any]:
  """Writes a built model to the new `out_dir` with its manifest (`fields` plus the
  architecture, tokenizer and file digests): to a temporary sibling, renamed at the
  end, so an interrupted build leaves nothing behind. Returns the manifest."""
  refuse_existing(out_dir)
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(dir=parent, prefix=".building-")
  try:
    write_model(model, tok, tmp, task_name)
    hf = hf_checkpoint.read_hf_config(tmp)
    kind = TOKENIZER_KINDS.get(task_name, "byte-level BPE")
    manifest = demo_bases.write_manifest(tmp, dict(
        fields, architecture={k: v for k, v in hf.items() if not k.endswith("token_id")},
        tokenizer=dict(kind=kind, vocab_size=tok.vocab_size, eos_ids=list(tok.eos_ids),
                       pad_id=tok.pad_id)))
    for name in os.listdir(tmp):  # readable by all, as package data must be
      os.chmod(os.path.join(tmp, name), 0o644)
    os.chmod(tmp, 0o755)
    os.rename(tmp, out_dir)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return manifest
