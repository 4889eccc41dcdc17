"""Tunix's GRPO learner as the third side of the whole-RL-step comparison (`trl_step`).

`trl_step.run_tunix` runs Google Tunix's (`google-tunix`) `GRPOLearner` on an
`RLCluster` with the "vanilla" rollout engine (the one that runs on a CPU) over the
config's model, problems and allocation; this module holds what it needs from Tunix,
as read in the google-tunix 0.1.7 source:

  * `settings`: isojax's settings as Tunix's (n as `num_generations`, B_p as the mini
    batch so each step is one optimizer update on the whole batch and one sampler
    call, isojax's micro-batch of the update as Tunix's train micro-batch, the sampler,
    the optimizer, the clip, the loss aggregation). Pure: it imports neither JAX nor
    Tunix, and refuses isojax settings Tunix's GRPO cannot express. Tunix accumulates
    micro-batches with `optax.MultiSteps`, the mean of their gradients, so its token
    mean is per micro-batch (isojax's is over the whole batch).
  * Weights: the GGUF checkpoint's tensors are written as a safetensors directory
    (`export_safetensors`, run in a process of its own so its memory is not the
    side's) and read by `tunix.models.llama3.params.create_model_from_safe_tensors`,
    float32, with a `ModelConfig` filled through `hf_checkpoint.model_config_from_hf`.
  * RoPE: Tunix 0.1.7's Llama attention calls `apply_rope` without the config's
    `rope_theta`, so every Llama runs at the default 1e6; `patch_rope` binds the
    model's own theta (SmolLM2's is 1e5).
  * Tokens: `PromptTokenizer` gives Tunix's sampler isojax's own prompt token ids for
    each rendered prompt text, decodes completions with isojax's tokenizer, prepends
    no BOS, and pads with -1: Tunix masks every buffer token equal to the pad id out of
    attention, and SmolLM2's pad id is its end-of-turn id, which every chat prompt
    holds. (-1 indexes the last row of the embedding, for pad positions only.)
  * Mesh: one device, both axes `AxisType.Auto` (with jax >= 0.8 `make_mesh` defaults
    to Explicit, and Tunix's embedding gather then fails).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import time
from typing import Sequence

import numpy as np

from isojax.config import run_settings
from isojax.models import gguf_checkpoint

PAD_ID = -1   # never a token: see the module docstring
# isojax's loss aggregations that Tunix's `loss_agg_mode` computes the same way.
LOSS_AGG_MODES = {"token_mean": "token-mean", "sequence_mean": "sequence-mean-token-mean"}
POLICY_LOSSES = ("ppo_clip", "dapo")   # symmetric clip, or DAPO's clip-higher


@dataclasses.dataclass(frozen=True)
class TunixSettings:
  """What Tunix's GRPO is given, each from an isojax setting."""
  num_generations: int        # n, rollouts per problem
  problems_per_step: int      # B_p: Tunix's mini_batch_size (one update a step) and the
                              # rollout's micro-batch (one sampler call, as isojax's)
  micro_batch_problems: int   # problems per forward/backward pass (gradient accumulation)
  max_tokens_to_generate: int
  temperature: float
  top_p: float
  top_k: int | None           # None: no top-k (isojax's 0)
  learning_rate: float        # the peak, after isojax's batch scaling
  warmup_steps: int           # linear from 0, then constant (one update per step)
  b1: float
  b2: float
  weight_decay: float
  grad_clip_norm: float       # 0: no clipping
  epsilon: float              # the ratio's lower clip
  epsilon_high: float         # its upper clip: `rl.clip_eps_high` under `dapo` only
  beta: float                 # the KL coefficient: 0, so no reference model
  loss_agg_mode: str
  num_iterations: int         # passes over each batch
  seed: int


def settings(s: run_settings.RunSettings) -> TunixSettings:
  """Tunix's GRPO settings for isojax's run settings; ValueError naming the first
  isojax setting Tunix's GRPO learner has no equivalent for."""
  rl, optim, sampling = s.rl, s.optim, s.sampling
  if rl.policy_loss not in POLICY_LOSSES:
    raise ValueError(f"rl.policy_loss={rl.policy_loss!r}: Tunix's GRPO loss is the PPO clip "
                     f"(with DAPO's upper clip); expected one of {POLICY_LOSSES}")
  # isojax's setting -> (its value, the one value Tunix's GRPO learner has for it)
  fixed = {"rl.advantage": (rl.advantage, "grpo"), "rl.kl_coef": (rl.kl_coef, 0.0),
           "rl.entropy_coef": (rl.entropy_coef, 0.0),
           "rl.num_minibatches": (rl.num_minibatches, 1),
           "rl.max_staleness": (rl.max_staleness, 0), "rl.downsample": (rl.downsample, "none"),
           "rl.dynamic_sampling": (rl.dynamic_sampling, False),
           "rl.overlong": (rl.overlong, "reward"),
           "rl.zero_variance_filter": (rl.zero_variance_filter, "off")}
  for field, (value, only) in fixed.items():
    if value != only:
      raise ValueError(f"{field}={value!r}: the Tunix side runs Tunix's GRPO learner, which "
                       f"has no equivalent; expected {only!r}")
  if rl.aggregation not in LOSS_AGG_MODES:
    raise ValueError(f"rl.aggregation={rl.aggregation!r}: Tunix's loss_agg_mode has "
                     f"{sorted(LOSS_AGG_MODES)} of isojax's")
  return TunixSettings(
      num_generations=s.rollouts_per_problem, problems_per_step=s.problems_per_batch,
      micro_batch_problems=micro_batch_problems(rl.micro_batch_size, s.rollouts_per_problem,
                                                s.problems_per_batch),
      max_tokens_to_generate=sampling.max_new_tokens, temperature=sampling.temperature,
      top_p=sampling.top_p, top_k=sampling.top_k or None, learning_rate=s.learning_rate,
      warmup_steps=s.warmup_steps * rl.updates_per_step, b1=optim.b1, b2=optim.b2,
      weight_decay=optim.weight_decay, grad_clip_norm=optim.grad_clip_norm,
      epsilon=rl.clip_eps,
      epsilon_high=rl.clip_eps_high if rl.policy_loss == "dapo" else rl.clip_eps,
      beta=rl.kl_coef, loss_agg_mode=LOSS_AGG_MODES[rl.aggregation],
      num_iterations=rl.num_epochs, seed=s.seed)


def micro_batch_problems(micro_batch_size: int, n: int, b_p: int) -> int:
  """Tunix's train micro-batch, in problems, for isojax's `rl.micro_batch_size` rollouts
  (0: the whole batch): whole groups, at least one, a divisor of B_p."""
  if not micro_batch_size:
    return b_p
  k = min(b_p, max(1, micro_batch_size // n))
  while b_p % k:
    k -= 1
  return k


def optimizer(t: TunixSettings):
  """isojax's optimizer as an optax transform: global-norm clip, then AdamW at a linear
  warm-up from 0 to the peak, constant after."""
  import optax  # pylint: disable=g-import-not-at-top
  schedule = (optax.warmup_constant_schedule(0.0, t.learning_rate, t.warmup_steps)
              if t.warmup_steps else optax.constant_schedule(t.learning_rate))
  return optax.chain(
      optax.clip_by_global_norm(t.grad_clip_norm) if t.grad_clip_norm else optax.identity(),
      optax.adamw(schedule, b1=t.b1, b2=t.b2, weight_decay=t.weight_decay))


def export_safetensors(gguf_file: str, folder: str) -> None:
  """The GGUF file's tensors (dequantized to float32, under their Hugging Face names)
  as `folder`/model.safetensors beside its config.json."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  source = gguf_checkpoint.open_file(gguf_file)
  tensors = gguf_checkpoint.GGUFTensors(source)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(source.hf_config(), f, indent=2)
  save_file({name: tensors.full(name) for name in tensors.names()},
            os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})


def export_in_child(gguf_file: str, folder: str) -> None:
  """`export_safetensors` in a child process of this interpreter."""
  cmd = [sys.executable, "-m", "isojax.bench.tunix_step", gguf_file, folder]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")


def llama_config(folder: str):
  """Tunix's Llama `ModelConfig` for the checkpoint in `folder` (float32 weights)."""
  from tunix.models.llama3 import model as llama  # pylint: disable=g-import-not-at-top
  from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  source = os.path.join(folder, "config.json")
  with open(source) as f:
    hf = json.load(f)
  cfg = hf_checkpoint.model_config_from_hf(hf, source=source)
  if hf.get("model_type") != "llama" or cfg.rope_scaling:
    raise ValueError(f"{source}: model_type={hf.get('model_type')!r}, rope_scaling="
                     f"{cfg.rope_scaling}; the Tunix side loads plain-RoPE Llama checkpoints")
  return llama.ModelConfig(**model_config_fields(cfg), weight_tying=cfg.tie_embeddings)


def model_config_fields(cfg) -> dict:
  """The fields Tunix's model configs (Qwen2's, Llama's) share, from isojax's
  `ModelConfig` of the same checkpoint."""
  return dict(num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.embed_dim,
              hidden_dim=cfg.mlp_dim, num_heads=cfg.num_heads, head_dim=cfg.head_dim,
              num_kv_heads=cfg.num_kv_heads, rope_theta=cfg.rope_theta,
              norm_eps=cfg.rms_norm_eps)


def patch_rope(rope_theta: float) -> None:
  """Tunix's Llama attention at `rope_theta` (it calls `apply_rope` without the config's,
  so its default 1e6 applies). For the whole process: call before anything is traced."""
  from tunix.models.llama3 import model as llama  # pylint: disable=g-import-not-at-top
  original = getattr(llama.apply_rope, "func", llama.apply_rope)
  llama.apply_rope = functools.partial(original, rope_theta=rope_theta)


def load_llama(folder: str):
  """Tunix's Llama with the weights in `folder`, float32, its RoPE theta patched in."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from tunix.models.llama3 import params  # pylint: disable=g-import-not-at-top
  cfg = llama_config(folder)
  patch_rope(cfg.rope_theta)
  return params.create_model_from_safe_tensors(folder, cfg, mesh=None, dtype=jnp.float32)


class PromptTokenizer:
  """The encode/decode/bos_id/eos_id/pad_id interface Tunix's `TokenizerAdapter`
  accepts: each prompt text encodes to isojax's own prompt ids (`ids`, text -> ids),
  any other text with isojax's tokenizer; completions decode as isojax decodes them
  (up to the first stop id, special tokens dropped)."""

  def __init__(self, tok, ids: dict[str, Sequence[int]]):
    self._tok, self._ids = tok, ids

  def encode(self, text: str, **unused) -> list[int]:
    if text in self._ids:
      return [int(i) for i in self._ids[text]]
    return self._tok.encode(text, add_bos=False)

  def decode(self, ids, **unused) -> str:
    return self._tok.decode([i for i in ids if i != PAD_ID])

  def bos_id(self):
    return None   # Tunix's Sampler.tokenize prepends a BOS only when this is truthy

  def eos_id(self) -> int:
    return self._tok.eos_id

  def pad_id(self) -> int:
    return PAD_ID


def learner(t: TunixSettings, model, tok: PromptTokenizer, eos_ids: Sequence[int],
            max_prompt_length: int, reward_fn, steps: int):
  """Tunix's `GRPOLearner` on one device: the policy trains and samples with the same
  weights (one mesh for both roles, so no weight sync and no asynchronous rollout), no
  reference model (beta 0)."""
  import jax  # pylint: disable=g-import-not-at-top
  from tunix.rl import rl_cluster as rl_cluster_lib  # pylint: disable=g-import-not-at-top
  from tunix.rl.grpo import grpo_learner  # pylint: disable=g-import-not-at-top
  from tunix.rl.rollout import base_rollout  # pylint: disable=g-import-not-at-top

  @dataclasses.dataclass(kw_only=True)
  class ClippedGRPOConfig(grpo_learner.GRPOConfig):
    # Tunix's GRPO loss reads `epsilon_high` when its config has one (else `epsilon`).
    epsilon_high: float

  if t.beta:
    raise ValueError(f"beta={t.beta}: the Tunix side keeps no reference model")
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=t.max_tokens_to_generate, max_prompt_length=max_prompt_length,
      kv_cache_size=max_prompt_length + t.max_tokens_to_generate,
      temperature=t.temperature, top_p=t.top_p, top_k=t.top_k, seed=t.seed,
      eos_tokens=list(eos_ids))
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optimizer(t), eval_every_n_steps=steps + 1, max_steps=steps,
      mini_batch_size=t.problems_per_step, train_micro_batch_size=t.micro_batch_problems,
      rollout_micro_batch_size=t.problems_per_step)
  cluster = rl_cluster_lib.RLCluster(
      actor=model, reference=None, tokenizer=tok,
      cluster_config=rl_cluster_lib.ClusterConfig(
          role_to_mesh={role: mesh for role in (rl_cluster_lib.Role.ACTOR,
                                                rl_cluster_lib.Role.REFERENCE,
                                                rl_cluster_lib.Role.ROLLOUT)},
          rollout_engine="vanilla", offload_to_cpu=False, training_config=training,
          rollout_config=rollout))
  algo = ClippedGRPOConfig(
      num_generations=t.num_generations, num_iterations=t.num_iterations, beta=t.beta,
      epsilon=t.epsilon, epsilon_high=t.epsilon_high, loss_agg_mode=t.loss_agg_mode)
  return grpo_learner.GRPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=reward_fn)


def time_steps(grpo, max_new_tokens: int) -> dict[str, list]:
  """Per-step timings of `grpo` (a `GRPOLearner`), filled as it trains.

  Tunix prepares each step's batch (generation, grading, advantages:
  `_generate_and_compute_advantage`) on a thread of its own while the trainer waits for
  it on a queue; with the actor and the rollout on one mesh it starts no batch ahead
  (`can_enable_async_rollout` is False), so the two alternate. `generate_s` times that
  call; `step_s` times `_run_global_step` (one optimizer update) until the updated
  weights are computed; generated tokens count each completion and the stop token it
  sampled (Tunix's completions end before it), as isojax's mask does.
  """
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  if grpo.can_enable_async_rollout:
    raise RuntimeError("Tunix would sample the next batch during the update: the "
                       "generation/update split below would not hold")
  timings: dict[str, list] = dict(generate_s=[], step_s=[], tokens=[], spans=[])
  # pylint: disable-next=protected-access
  generate, run_step = grpo._generate_and_compute_advantage, grpo._run_global_step

  def timed_generate(*args, **kwargs):
    start = time.perf_counter()
    example = generate(*args, **kwargs)
    end = time.perf_counter()
    timings["generate_s"].append(end - start)
    timings["spans"].append(("generate", start, end))
    lengths = np.asarray(example.completion_mask).sum(axis=-1)
    timings["tokens"].append(int(np.minimum(lengths + 1, max_new_tokens).sum()))
    return example

  def timed_step(*args, **kwargs):
    start = time.perf_counter()
    out = run_step(*args, **kwargs)
    jax.block_until_ready(jax.tree.leaves(nnx.state(grpo.rl_cluster.actor_trainer.model)))
    end = time.perf_counter()
    timings["step_s"].append(end - start)
    timings["spans"].append(("step", start, end))
    return out

  grpo._generate_and_compute_advantage = timed_generate  # pylint: disable=protected-access
  grpo._run_global_step = timed_step  # pylint: disable=protected-access
  return timings


def nested(spans: list[tuple[str, float, float]]) -> bool:
  """Each generation lies inside one step, one per step: the split is a split."""
  steps = [(a, b) for kind, a, b in spans if kind == "step"]
  gens = [(a, b) for kind, a, b in spans if kind == "generate"]
  return len(steps) == len(gens) and all(s0 <= g0 <= g1 <= s1
                                         for (s0, s1), (g0, g1) in zip(steps, gens))


def version() -> str:
  import importlib.metadata  # pylint: disable=g-import-not-at-top
  return importlib.metadata.version("google-tunix")


def main(argv: Sequence[str]) -> None:
  """`python -m isojax.bench.tunix_step GGUF_FILE FOLDER`: `export_safetensors`."""
  if len(argv) != 2:
    raise SystemExit("usage: python -m isojax.bench.tunix_step GGUF_FILE FOLDER")
  export_safetensors(*argv)


if __name__ == "__main__":
  main(sys.argv[1:])
