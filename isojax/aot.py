"""Does one RL step fit in a pod's HBM? Compiles it for the pod on a CPU-only machine.

Compiles ahead of time, for the chips of --topology (v5p-64, v5p-128, v5e-256, v5e-8,
v6e-8, with `2x` in front for two slices; or cpu:N fake CPU devices), the programs of one
step as `isojax.run.train` calls them: the sampler (`sampling.sampler.sample`, one call of
at most `sampling.max_rollouts_per_call` rollouts), the old / reference log-prob pass
(`rl.update.score`, one program run once or twice) and the update
(`rl.update.train_step`); with `rl.advantage=gae` also PPO's critic, its value pass
(`rl.critic.values`) and its update (`rl.critic.critic_step`). Everything is lowered from
`jax.ShapeDtypeStruct`s carrying the run's NamedShardings, so no weight is allocated;
the update's arrays (LoRA's split, the optimizer state, the KL reference) and the
critic's come from the functions a run builds them with (`rl.step.policy_arrays`,
`rl.critic.abstract`, `rl.critic.init_optimizer`), given shapes instead of weights.
It prints each program's per-chip memory (XLA's `memory_analysis`) plus the train
state that stays on the chips while it runs (`resident`: optimizer state, reference
weights, the critic and its optimizer state), against the chip's HBM, and exits non-zero
naming the program, its numbers and the config fields that shrink it when one does not
fit. Beside the bytes, each program's model FLOPs per run over all chips: 2 per
weight per token forward and 6 forward and backward (4 for weights that LoRA freezes;
a frozen critic trunk: 2), times
the update's epochs; embedding lookups, attention scores and recomputation are not
counted (XLA's own cost analysis counts a loop's body once, so it cannot say this).

Model shapes come from --model (a known Hugging Face config), else from
`base_model.path`/config.json, else from the shipped demo base model the run would load.
Prompts get --prompt_len slots; responses `sampling.max_new_tokens`.
libtpu is not a dependency of isojax: the tests use cpu:N only.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from isojax import topology
from isojax.base_models import demo_bases
from isojax.config import run_settings
from isojax.models import hf_checkpoint, sharding, transformer
from isojax.models import settings as model_settings
from isojax.rl import critic as critic_lib
from isojax.rl import optimizer, rollout, update
from isojax.rl import settings as rl_settings
from isojax.rl import step as rl_step
from isojax.sampling import sampler
from isojax.sampling import settings as sampling_settings

GIB = topology.GIB
_QWEN2 = dict(model_type="qwen2", rope_theta=1e6, rms_norm_eps=1e-6, hidden_act="silu")
HF_CONFIGS = {  # Hugging Face config.json fields that fix the parameter shapes
    "qwen2.5-7b": dict(_QWEN2, num_hidden_layers=28, hidden_size=3584, num_attention_heads=28,
                       num_key_value_heads=4, head_dim=128, intermediate_size=18944,
                       vocab_size=152064, tie_word_embeddings=False),
    "qwen2.5-1.5b": dict(_QWEN2, num_hidden_layers=28, hidden_size=1536, num_attention_heads=12,
                         num_key_value_heads=2, head_dim=128, intermediate_size=8960,
                         vocab_size=151936, tie_word_embeddings=True),
}
# What shrinks each program's memory, named in the error when it does not fit.
REMEDIES = {
    "sample": "sampling.max_rollouts_per_call (the decode cache grows with it), mesh.tensor",
    "score": "rl.micro_batch_size, rl.logprob_chunk_size, model.attention_chunk",
    "train_step": "rl.micro_batch_size, rl.logprob_chunk_size, model.remat, "
                  "model.attention_chunk",
  "values": "rl.micro_batch_size, model.attention_chunk, critic.path (a smaller critic)",
  "critic_step": "rl.micro_batch_size, model.remat, model.attention_chunk, "
                 "critic.train_trunk=False, critic.path (a smaller critic)",
}


@dataclasses.dataclass(frozen=True)
class ProgramMemory:
  """Per-chip bytes of one compiled program; `error` when XLA refused to compile it."""
  name: str
  argument: int = 0
  output: int = 0
  alias: int = 0      # outputs written into donated argument buffers
  temp: int = 0
  resident: int = 0   # train state on the chip that is not an argument
  error: str = ""
  inputs: str = ""    # the shapes it was compiled for
  flops: float = 0.0  # model FLOPs of one run, all chips together

  @property
  def total(self) -> int:
    return self.argument + self.output - self.alias + self.temp + self.resident


def critic_model_config(critic: rl_settings.CriticSettings,
                        model: model_settings.ModelSettings, policy_cfg):
  """The critic's `ModelConfig`: the policy's, or that of `critic.path`/config.json."""
  path = critic.path
  if not path:
    return policy_cfg
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise ValueError(f"critic.path={path}: no config.json")
  return hf_checkpoint.model_config_from_hf(
      hf_checkpoint.read_hf_config(path), source=os.path.join(path, "config.json"),
      **model.as_kwargs())


def weight_counts(state) -> tuple[int, int]:
  """(weights every token passes, LM-head weights) of a model's state: the embedding
  table is a lookup, not a matmul (with tied embeddings it is the head)."""
  counts = {"body": 0, "embed": 0, "head": 0}
  for path, leaf in nnx.to_flat_state(state):
    name = path[1] if path[0] == "trunk" else path[0]   # a critic's decoder is its trunk
    part = {"lm_head": "head", "embed": "embed"}.get(name, "body")
    counts[part] += math.prod(leaf.shape)
  return counts["body"], counts["head"] or counts["embed"]


def model_config(s: run_settings.RunSettings, model: str | None = None):
  """The `ModelConfig` of --model, of base_model.path, or of the shipped demo model."""
  if model:
    if model not in HF_CONFIGS:
      raise ValueError(f"--model={model!r}: expected one of {sorted(HF_CONFIGS)}")
    hf, source = HF_CONFIGS[model], f"--model={model}"
  else:
    path = demo_bases.policy_path(s.base_model.path, s.task)  # as the run checks it
    hf, source = hf_checkpoint.read_hf_config(path), hf_checkpoint.config_source(path)
  return hf_checkpoint.model_config_from_hf(hf, source=source, **s.model.as_kwargs())


def _spec(shape, dtype, mesh) -> jax.ShapeDtypeStruct:
  """Split along the batch axes as `sharding.shard_batch` would; replicated if uneven."""
  split = shape[0] % sharding.batch_shards(mesh) == 0
  placed = sharding.batch_sharding(mesh, len(shape)) if split else sharding.replicated(mesh)
  return jax.ShapeDtypeStruct(shape, dtype, sharding=placed)


def _chip_bytes(tree) -> int:
  return sum(math.prod(x.sharding.shard_shape(x.shape)) * jnp.dtype(x.dtype).itemsize
             for x in jax.tree.leaves(tree))


def _measure(name: str, lower, resident: int, inputs: str, flops: float) -> ProgramMemory:
  logging.info("compiling %s: %s", name, inputs)
  try:
    stats = lower().compile().memory_analysis()
  except Exception as e:  # pylint: disable=broad-except
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return ProgramMemory(name, resident=resident, error=str(e).strip().splitlines()[0],
                         inputs=inputs, flops=flops)
  return ProgramMemory(name, stats.argument_size_in_bytes, stats.output_size_in_bytes,
                       stats.alias_size_in_bytes, stats.temp_size_in_bytes, resident,
                       inputs=inputs, flops=flops)


@dataclasses.dataclass(frozen=True)
class _PolicyArrays:
  """The policy's arrays as a run builds them, abstract: LoRA trains (and Adam holds)
  the adapters, the base is read, not donated."""
  graphdef: Any
  params: Any              # placed on the learner's mesh
  sample_params: Any       # placed on the sampler's mesh
  tx: Any
  trained: Any
  frozen: Any
  opt_state: Any
  param_bytes: int         # per chip
  opt_bytes: int
  ref_bytes: int           # the KL reference: a copy, or with LoRA its zero adapters
  snapshot_bytes: int      # the generator's copy beside the learner's (off-policy, shared)


def _policy_arrays(s: run_settings.RunSettings, model_cfg, mesh, sample_mesh,
                   shared: bool) -> _PolicyArrays:
  graphdef, abstract = nnx.split(transformer.abstract_model(model_cfg))
  placed = lambda tree, shardings: jax.tree.map(
      lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree, shardings)
  params = placed(abstract, sharding.state_shardings(abstract, mesh))
  tx, _ = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                   warmup_steps=s.warmup_steps,
                                   updates_per_step=s.rl.updates_per_step)
  arrays = rl_step.policy_arrays(params, tx, mesh, lora=model_cfg.lora.enabled,
                                 keeps_reference=s.rl.keeps_reference, abstract=True)
  lora = arrays.frozen is not None
  param_bytes = _chip_bytes(params)
  # LoRA's reference is the base itself, whose arrays it shares: only its adapters are new.
  ref_bytes = (0 if arrays.reference is None else _chip_bytes(arrays.trained) if lora
               else _chip_bytes(arrays.reference))
  return _PolicyArrays(
      graphdef, params, placed(abstract, sharding.state_shardings(abstract, sample_mesh)),
      tx, arrays.trained, arrays.frozen, arrays.opt_state, param_bytes,
      _chip_bytes(arrays.opt_state), ref_bytes,
      param_bytes if s.rl.max_staleness and shared else 0)


@dataclasses.dataclass(frozen=True)
class _CriticState:
  """PPO's critic on the learner's chips, abstract: its weights and Adam state stay."""
  graphdef: Any
  params: Any
  frozen: Any              # the policy's weights as the trunk of a head on it, else None
  tx: Any
  opt_state: Any
  bytes: int               # per chip: weights and optimizer state


def _critic_state(s: run_settings.RunSettings, model_cfg, params, mesh) -> _CriticState:
  graphdef, critic_params = critic_lib.abstract(
      critic_model_config(s.critic, s.model, model_cfg), mesh, s.critic.trunk)
  frozen = critic_lib.policy_trunk(params) if s.critic.trunk == "policy" else None
  tx = critic_lib.make_optimizer(s.critic, s.optim, warmup_steps=s.warmup_steps,
                                 updates_per_step=s.rl.updates_per_step)
  opt = critic_lib.init_optimizer(tx, critic_params, mesh, s.critic.train_trunk,
                                  abstract=True)
  return _CriticState(graphdef, critic_params, frozen, tx, opt,
                      _chip_bytes(critic_params) + _chip_bytes(opt))


def check(s: run_settings.RunSettings, devices: list, model_cfg,
          prompt_len: int) -> list[ProgramMemory]:
  """Compiles sample, score and train_step of one step of the run `s` for `devices`.

  With `mesh.rollout_fraction` > 0 the sampler is compiled for its own devices (the
  generator's mesh) and score and train_step for the learner's, each program's bytes
  per chip of its own slice. Off-policy runs on shared devices (`rl.max_staleness` > 0,
  no split) hold the generator's copy of the weights beside the learner's: it counts as
  resident in every program. With `rl.advantage=gae` the critic's values and
  critic_step are compiled on the learner's chips too; the critic's weights and
  optimizer state are resident in every program of those chips, the policy's in the
  critic's.
  """
  mesh, rollout_mesh = sharding.make_meshes(s.mesh.as_kwargs(), devices)
  sample_mesh = mesh if rollout_mesh is None else rollout_mesh
  policy = _policy_arrays(s, model_cfg, mesh, sample_mesh, shared=rollout_mesh is None)
  critic = _critic_state(s, model_cfg, policy.params, mesh) if s.rl.uses_critic else None
  critic_bytes = critic.bytes if critic else 0
  on = lambda mesh, what: ("" if rollout_mesh is None else
                           f" on the {mesh.devices.size} {what} chips")
  weights = weight_counts(policy.params)
  # While one copy of the weights is an argument the other (and Adam's state) waits.
  waiting = policy.opt_bytes + policy.ref_bytes + policy.snapshot_bytes + critic_bytes
  sampled = _sample_program(
      policy.graphdef, policy.sample_params, s.sampling, n=s.rollouts_per_problem,
      problems=s.problems_per_batch, prompt_len=prompt_len, mesh=sample_mesh,
      vocab_size=model_cfg.vocab_size, weights=weights,
      resident=0 if rollout_mesh is not None else waiting, where=on(sample_mesh, "sampling"))
  # Lowered under their meshes, as isojax runs them: activations take their logical axes.
  with jax.set_mesh(mesh):
    return [sampled, *_update_programs(s, model_cfg, policy, critic, mesh, prompt_len,
                                       weights, on(mesh, "learner"))]


def _update_programs(s: run_settings.RunSettings, model_cfg, policy: _PolicyArrays,
                     critic: _CriticState | None, mesh, prompt_len: int,
                     weights: tuple[int, int], where: str) -> list[ProgramMemory]:
  """score and train_step (and the critic's programs) on the learner's `mesh`."""
  m, p, t = s.train_rollouts_per_problem, prompt_len, s.sampling.max_new_tokens
  settings = update.UpdateSettings.derive(s.rl, s.sampling, group_size=m, prompt_len=p)
  b = s.problems_per_batch * m  # rollouts scored and trained per step
  critic_bytes = critic.bytes if critic else 0
  score = lambda: update.score.lower(
      policy.graphdef, policy.params, _spec((b, p + t), jnp.int32, mesh),
      _spec((b, p + t), bool, mesh), prompt_len=p, temperature=settings.temperature,
      micro_batch_size=settings.micro_batch_size, chunk_size=settings.logprob_chunk_size)
  f32, row = jnp.float32, lambda dtype: _spec((b, t), dtype, mesh)
  tokens, mask = _spec((b, p + t), jnp.int32, mesh), _spec((b, p + t), bool, mesh)
  batch = update.TrainBatch(
      tokens=tokens, mask=mask, response_mask=row(bool), sampler_logp=row(f32),
      old_logp=row(f32), ref_logp=row(f32),
      # GAE: one advantage per token, and the outcome rewards the critic's returns use
      advantages=row(f32) if critic else _spec((b,), f32, mesh),
      keep_pg=_spec((b,), bool, mesh), keep_reg=_spec((b,), bool, mesh),
      shuffle_rng=_key_on(mesh), rewards=_spec((b,), f32, mesh) if critic else None)
  train_step = lambda: update.train_step.lower(
      policy.graphdef, policy.trained, policy.opt_state, batch, tx=policy.tx,
      settings=settings, frozen=policy.frozen)
  split = (f"micro-batches of {settings.micro_batch_size or 'all'}, LM head chunks of "
           f"{settings.logprob_chunk_size or 'all'}")
  # Model FLOPs: 2 per weight per token forward, 6 with the backward pass (LoRA: no
  # weight gradients for the frozen base, 4); the LM head sees only the response.
  body, head = weights
  per_pass = body * b * (p + t) + head * b * t
  lora = policy.frozen is not None
  results = [
      _measure("score", score, policy.opt_bytes + policy.ref_bytes + policy.snapshot_bytes
               + critic_bytes, f"[{b}, {p + t}] tokens, {split}{where}", 2 * per_pass),
      _measure("train_step", train_step,
               policy.ref_bytes + policy.snapshot_bytes + critic_bytes,
               f"[{b}, {p + t}] tokens, {settings.num_minibatches} minibatch(es), "
               f"{split}, remat {model_cfg.remat}"
               f"{f', LoRA rank {model_cfg.lora.rank}' if lora else ''}{where}",
               (4 if lora else 6) * s.rl.num_epochs * per_pass)]
  if critic:
    value_settings = critic_lib.ValueUpdateSettings.derive(s.critic, s.rl, group_size=m,
                                                           prompt_len=p)
    trunk = (critic.params if critic.frozen is None
             else nnx.merge_state(critic.frozen, critic.params))
    results += _critic_programs(
        value_settings, critic.graphdef, critic.params, critic.frozen, critic.opt_state,
        critic.tx, tokens, mask, batch, settings,
        policy.param_bytes + policy.opt_bytes + policy.ref_bytes + policy.snapshot_bytes,
        weight_counts(trunk)[0], where)
  return results


def _key_on(mesh) -> jax.ShapeDtypeStruct:
  key = jax.eval_shape(jax.random.key, 0)
  return jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=sharding.replicated(mesh))


def _sample_program(graphdef, params, sampling: sampling_settings.SamplingSettings, *,
                    n: int, problems: int, prompt_len: int, mesh, vocab_size: int,
                    weights: tuple[int, int], resident: int, where: str) -> ProgramMemory:
  """One sampler call as `rollout.sample` makes it for a step of `problems` problems:
  whole groups, each device the same number, at most `sampling.max_rollouts_per_call`
  rollouts; lowered under `mesh`. `weights`: (body, LM head) weight counts; the
  sampler prefills each prompt once."""
  p, t, shards = prompt_len, sampling.max_new_tokens, sharding.batch_shards(mesh)
  groups, _ = rollout.call_plan(problems, n, sampling.max_rollouts_per_call, shards)
  spec = rollout.sample_spec(sampling, n=n, rollouts_per_call=groups * n, shards=shards,
                             stop_ids=(vocab_size - 1,), pad_id=0)
  sample = lambda: sampler.sample.lower(
      graphdef, params, _spec((groups, p), jnp.int32, mesh), _spec((groups, p), bool, mesh),
      _key_on(mesh), spec)
  decoding = (f", {spec.num_slots} decode slots" if spec.num_slots else "") + (
      f" halving down to {spec.min_slots}" if spec.min_slots else "") + (
      f", {sampling.dtype} activations and caches" if sampling.dtype else "")
  body, head = weights
  with jax.set_mesh(mesh):
    return _measure("sample", sample, resident,
                    f"{groups} prompts [{groups}, {p}] x {n} rollouts of {t} tokens"
                    f"{decoding}{where}",
                    2 * (body * groups * p + (body + head) * groups * n * t))


def _critic_programs(critic_settings: critic_lib.ValueUpdateSettings, graphdef, params, frozen,
                     opt_state, tx, tokens, mask,
                     batch: update.TrainBatch, settings: update.UpdateSettings,
                     resident: int, body: int, where: str) -> list[ProgramMemory]:
  """The critic's value pass and update, lowered from `critic_lib`'s jitted functions
  with the policy's state (`resident` bytes) waiting beside them; `frozen`: the policy's
  weights as the trunk of a head on it (`critic.trunk="policy"`), else None."""
  b, s = tokens.shape
  p = settings.prompt_len
  values = lambda: critic_lib.values.lower(graphdef, params, tokens, mask, prompt_len=p,
                                           micro_batch_size=settings.micro_batch_size,
                                           frozen=frozen)
  f32_BT = batch.old_logp   # a [B, T] float32 placed like every response row
  value_batch = critic_lib.ValueBatch(tokens, mask, batch.response_mask, old_values=f32_BT,
                                      returns=f32_BT, shuffle_rng=batch.shuffle_rng)
  step = lambda: critic_lib.critic_step.lower(graphdef, params, opt_state, value_batch,
                                              tx=tx, settings=critic_settings, frozen=frozen)
  trunk = ("the policy's (head only)" if frozen is not None else
           "trained" if critic_settings.train_trunk else "frozen (head only)")
  per_token = 6 if critic_settings.train_trunk else 2   # a frozen trunk runs forward only
  return [
      _measure("values", values, resident, f"[{b}, {s}] tokens, micro-batches of "
               f"{settings.micro_batch_size or 'all'}{where}", 2 * body * b * s),
      _measure("critic_step", step, resident,
               f"[{b}, {s}] tokens, {settings.num_minibatches} minibatch(es), trunk "
               f"{trunk}{where}", per_token * settings.num_epochs * body * b * s)]


def format_table(results: list[ProgramMemory], hbm: int | None) -> str:
  """Per-chip memory of each program in GiB (MiB when everything is under 1 GiB) and its
  model FLOPs over all chips."""
  unit, name = (GIB, "GiB") if max([r.total for r in results] + [hbm or 0]) >= GIB else (
      1 << 20, "MiB")
  head = ("program", "argument", "output", "alias", "temp", "resident", "total", "FLOPs")
  lines = [f"{head[0]:<12}" + "".join(f"{h:>10}" for h in head[1:]) + f"  ({name} per chip; "
           + (f"HBM {hbm / unit:.2f}; " if hbm else "HBM unknown; ") + "FLOPs of one run)"]
  for r in results:
    cells = (r.argument, r.output, r.alias, r.temp, r.resident, r.total)
    lines.append(f"{r.name:<12}" + ("".join(f"{c / unit:10.2f}" for c in cells)
                                    + f"{r.flops:10.3g}" if not r.error
                                    else f"  XLA: {r.error}"))
  return "\n".join(lines + [f"  {r.name}: {r.inputs}" for r in results])


def overflows(results: list[ProgramMemory], hbm: int | None) -> list[str]:
  """One message per program that does not fit (or that XLA refused to compile)."""
  out = []
  for r in results:
    fix = f"; change {REMEDIES[r.name]}"
    if r.error:
      out.append(f"{r.name}: XLA ran out of memory compiling it ({r.error}){fix}")
    elif hbm and r.total > hbm:
      out.append(f"{r.name}: needs {_size(r.total)} per chip (arguments {_size(r.argument)}, "
                 f"outputs {_size(r.output)}, aliased {_size(r.alias)}, temporaries "
                 f"{_size(r.temp)}, resident state {_size(r.resident)}) but a chip has "
                 f"{_size(hbm)}{fix}")
  return out


def _size(x: int) -> str:
  return f"{x / GIB:.2f} GiB" if x >= GIB else f"{x / (1 << 20):.2f} MiB"
