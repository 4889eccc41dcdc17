"""Does one RL step fit in a pod's HBM? Compiles it for the pod on a CPU-only machine.

Compiles ahead of time, for the chips of --topology (v5p-64, v5p-128, v5e-256, v5e-8,
v6e-8, with `2x` in front for two slices; or cpu:N fake CPU devices), the programs of one
step as `isojax.train` calls them: the sampler (`sampling.sampler.sample`, one call of
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
import re

import jax
import jax.numpy as jnp
import ml_collections
from absl import logging
from flax import nnx

from isojax import config_lib
from isojax.models import hf_checkpoint, sharding, transformer
from isojax.rl import critic as critic_lib
from isojax.models import settings as model_settings
from isojax.rl import optimizer, rollout, update
from isojax.rl import step as rl_step
from isojax.rl import settings as rl_settings
from isojax.sampling import sampler
from isojax.sampling import settings as sampling_settings
from isojax.tasks import demo_bases

GIB = 1 << 30
# get_topology_desc arguments of each pod slice; chips_per_host_bounds=(2, 2, 1).
TOPOLOGIES = {
    "v5p-64": dict(topology_name="v5:2x4x4", chip_config_name="megacore", wrap=(False,) * 3),
    "v5p-128": dict(topology_name="v5:4x4x4", chip_config_name="megacore", wrap=(True,) * 3),
    "v5e-256": dict(topology_name="v5e:16x16", chip_config_name="default",
                    wrap=(True, True, False)),
    "v5e-8": dict(topology_name="v5e:2x4", chip_config_name="default", wrap=(False,) * 3),
    "v6e-8": dict(topology_name="v6e:2x4", chip_config_name="default", wrap=(False,) * 3),
}
HBM_GIB = {"TPU v5": 95, "TPU v5 lite": 16, "TPU v6 lite": 32}  # per chip (v5p, v5e, v6e)
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


def prepare_backend(topology: str) -> None:
  """Call before anything touches a device: a CPU backend, and libtpu for compiling only."""
  if topology.startswith("cpu:"):
    jax.config.update("jax_num_cpu_devices", _cpu_count(topology))
  else:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no GCE metadata server here
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # nothing runs on a TPU
  jax.config.update("jax_platforms", "cpu")


def _cpu_count(topology: str) -> int:
  count = topology.removeprefix("cpu:")
  if not count.isdigit() or int(count) < 1:
    raise ValueError(f"--topology={topology!r}: expected cpu:N with N >= 1")
  return int(count)


def topology_devices(topology: str) -> list:
  """The devices of a named TPU topology (libtpu, nothing allocated) or of cpu:N."""
  if topology.startswith("cpu:"):
    count, devices = _cpu_count(topology), jax.devices("cpu")
    if len(devices) < count:
      raise ValueError(f"--topology={topology}: this process has {len(devices)} CPU "
                       f"devices; start Python with XLA_FLAGS=--xla_force_host_platform_"
                       f"device_count={count} (python -m launch.aot does it itself)")
    return devices[:count]
  slices, name = re.fullmatch(r"(?:(\d+)x)?(.*)", topology).groups()
  if name not in TOPOLOGIES:
    raise ValueError(f"--topology={topology!r}: expected cpu:N or [Kx]one of "
                     f"{sorted(TOPOLOGIES)}")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    return topologies.get_topology_desc(platform="tpu", chips_per_host_bounds=(2, 2, 1),
                                        num_slices=int(slices or 1),
                                        **TOPOLOGIES[name]).devices
  except Exception as e:  # libtpu missing or refusing: say how to get it
    raise ValueError(f"--topology={topology}: cannot describe the TPU topology ({e}); "
                     'install libtpu with pip install "jax[tpu]==<your jax version>"') from e


def hbm_bytes(devices: list, hbm_gib: float | None = None) -> int | None:
  """Per-chip memory: --hbm_gib, else what the device reports, else HBM_GIB, else unknown."""
  if hbm_gib:
    return int(hbm_gib * GIB)
  try:
    return int(devices[0].memory_stats()["bytes_limit"])
  except Exception:  # topology devices are not addressable; CPU reports nothing
    gib = HBM_GIB.get(devices[0].device_kind)
    return gib * GIB if gib else None


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


def model_config(config: ml_collections.ConfigDict, model: str | None = None):
  """The `ModelConfig` of --model, of base_model.path, or of the shipped demo model."""
  if model:
    if model not in HF_CONFIGS:
      raise ValueError(f"--model={model!r}: expected one of {sorted(HF_CONFIGS)}")
    hf, source = HF_CONFIGS[model], f"--model={model}"
  else:
    s = config_lib.settings(config)
    path = demo_bases.policy_path(s.base_model.path, s.task)  # as the run checks it
    hf, source = hf_checkpoint.read_hf_config(path), hf_checkpoint.config_source(path)
  return hf_checkpoint.model_config_from_hf(hf, source=source, **config.model)


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


def check(config: ml_collections.ConfigDict, devices: list, model_cfg,
          prompt_len: int) -> list[ProgramMemory]:
  """Compiles sample, score and train_step of one step of `config` for `devices`.

  With `mesh.rollout_fraction` > 0 the sampler is compiled for its own devices (the
  generator's mesh) and score and train_step for the learner's, each program's bytes
  per chip of its own slice. Off-policy runs on shared devices (`rl.max_staleness` > 0,
  no split) hold the generator's copy of the weights beside the learner's: it counts as
  resident in every program. With `rl.advantage=gae` the critic's values and
  critic_step are compiled on the learner's chips too; the critic's weights and
  optimizer state are resident in every program of those chips, the policy's in the
  critic's.
  """
  s = config_lib.settings(config_lib.resolve(config))
  mesh, rollout_mesh = sharding.make_meshes(s.mesh.as_kwargs(), devices)
  sample_mesh = mesh if rollout_mesh is None else rollout_mesh
  n, m, b_p = s.rollouts_per_problem, s.train_rollouts_per_problem, s.problems_per_batch
  p, t = prompt_len, s.sampling.max_new_tokens
  graphdef, abstract = nnx.split(transformer.abstract_model(model_cfg))
  placed = lambda tree, shardings: jax.tree.map(
      lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
  params = placed(abstract, sharding.state_shardings(abstract, mesh))
  sample_params = placed(abstract, sharding.state_shardings(abstract, sample_mesh))
  # The update's arrays as a run builds them: LoRA trains (and Adam holds) the adapters,
  # the base is read, not donated.
  tx, _ = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                updates_per_step=s.rl.updates_per_step)
  arrays = rl_step.policy_arrays(params, tx, mesh, lora=model_cfg.lora.enabled,
                                 keeps_reference=s.rl.keeps_reference, abstract=True)
  trained, frozen, opt_state = arrays.trained, arrays.frozen, arrays.opt_state
  settings = update.UpdateSettings.derive(s.rl, s.sampling, group_size=m, prompt_len=p)
  param_bytes, opt_bytes = _chip_bytes(params), _chip_bytes(opt_state)
  # The reference: a copy of the weights, or with LoRA the base itself, whose arrays it
  # shares (only its zero adapters are new).
  ref_bytes = (0 if arrays.reference is None else _chip_bytes(trained) if frozen is not None
               else _chip_bytes(arrays.reference))
  # The generator's weights beside the learner's (off-policy on shared devices).
  snapshot_bytes = param_bytes if s.rl.max_staleness and rollout_mesh is None else 0
  # PPO's critic on the learner's chips: its weights and Adam state stay there.
  uses_critic = s.rl.uses_critic
  if uses_critic:
    critic_graphdef, critic_params = critic_lib.abstract(
        critic_model_config(s.critic, s.model, model_cfg), mesh, s.critic.trunk)
    # A head on the policy's trunk: the policy's weights are its (frozen) trunk.
    critic_frozen = critic_lib.policy_trunk(params) if s.critic.trunk == "policy" else None
    critic_tx = critic_lib.make_optimizer(s.critic, s.optim,
                                          updates_per_step=s.rl.updates_per_step)
    critic_opt = critic_lib.init_optimizer(critic_tx, critic_params, mesh,
                                           s.critic.train_trunk, abstract=True)
    critic_bytes = _chip_bytes(critic_params) + _chip_bytes(critic_opt)
  else:
    critic_bytes = 0
  on = lambda mesh, what: ("" if rollout_mesh is None else
                           f" on the {mesh.devices.size} {what} chips")
  body, head = weight_counts(abstract)
  # While one copy of the weights is an argument the other (and Adam's state) waits.
  sampled = _sample_program(
      graphdef, sample_params, s.sampling, n=n, problems=b_p, prompt_len=p,
      mesh=sample_mesh, vocab_size=model_cfg.vocab_size, weights=(body, head),
      resident=0 if rollout_mesh is not None else (opt_bytes + ref_bytes + snapshot_bytes
                                                   + critic_bytes),
      where=on(sample_mesh, "sampling"))

  b = b_p * m  # rollouts scored and trained per step; train_step splits the minibatches
  score = lambda: update.score.lower(
      graphdef, params, _spec((b, p + t), jnp.int32, mesh), _spec((b, p + t), bool, mesh),
      prompt_len=p, temperature=settings.temperature,
      micro_batch_size=settings.micro_batch_size, chunk_size=settings.logprob_chunk_size)

  f32, row = jnp.float32, lambda dtype: _spec((b, t), dtype, mesh)
  tokens, mask = _spec((b, p + t), jnp.int32, mesh), _spec((b, p + t), bool, mesh)
  batch = update.TrainBatch(
      tokens=tokens, mask=mask, response_mask=row(bool), sampler_logp=row(f32),
      old_logp=row(f32), ref_logp=row(f32),
      # GAE: one advantage per token, and the outcome rewards the critic's returns use
      advantages=row(f32) if uses_critic else _spec((b,), f32, mesh),
      keep_pg=_spec((b,), bool, mesh), keep_reg=_spec((b,), bool, mesh),
      shuffle_rng=_key_on(mesh), rewards=_spec((b,), f32, mesh) if uses_critic else None)
  train_step = lambda: update.train_step.lower(graphdef, trained, opt_state, batch, tx=tx,
                                               settings=settings, frozen=frozen)
  split = (f"micro-batches of {settings.micro_batch_size or 'all'}, LM head chunks of "
           f"{settings.logprob_chunk_size or 'all'}")
  # Model FLOPs: 2 per weight per token forward, 6 with the backward pass; the LM head
  # sees only the response positions.
  epochs = s.rl.num_epochs
  flops = dict(score=2 * (body * b * (p + t) + head * b * t),
               # LoRA: no weight gradients for the frozen base, 4 FLOPs per weight
               train_step=(6 if frozen is None else 4) * epochs * (body * b * (p + t)
                                                                   + head * b * t))
  # Lowered under their meshes, as isojax runs them: activations take their logical axes.
  with jax.set_mesh(mesh):
    results = [
        sampled,
        _measure("score", score, opt_bytes + ref_bytes + snapshot_bytes + critic_bytes,
                 f"[{b}, {p + t}] tokens, {split}{on(mesh, 'learner')}", flops["score"]),
        _measure("train_step", train_step, ref_bytes + snapshot_bytes + critic_bytes,
                 f"[{b}, {p + t}] tokens, {settings.num_minibatches} minibatch(es), "
                 f"{split}, remat {model_cfg.remat}"
                 f"{f', LoRA rank {model_cfg.lora.rank}' if frozen is not None else ''}"
                 f"{on(mesh, 'learner')}",
                 flops["train_step"])]
    if uses_critic:
      value_settings = critic_lib.ValueUpdateSettings.derive(s.critic, s.rl, group_size=m,
                                                             prompt_len=p)
      results += _critic_programs(value_settings, critic_graphdef, critic_params, critic_frozen,
                                  critic_opt, critic_tx, tokens, mask, batch, settings,
                                  param_bytes + opt_bytes + ref_bytes + snapshot_bytes,
                                  weight_counts(critic_params if critic_frozen is None else
                                                nnx.merge_state(critic_frozen, critic_params))[0],
                                  on(mesh, "learner"))
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
