"""The gpu section, for a machine with an accelerator: RL steps of a policy of
Qwen2.5-1.5B's shape, synchronous and pipelined, with their memory.

The policy has random weights (`write_policy`), and its tokenizer is the arithmetic
task's with its vocabulary padded to the model's, so sampling draws from all 151,936
ids (almost none of them digits, so responses run to `max_new_tokens` and rewards are
0: the update still runs on every rollout). Each run is `isojax.main` on
configs/hard.py with that policy (bfloat16 activations, float32 weights and AdamW,
layers rematerialised, cuDNN's attention where it runs (`model.attention_impl=auto`),
B_p x n rollouts of `NEW_TOKENS` tokens; on a GPU the defaults sample from bfloat16
weights and multiply the float32 LM head as two bfloat16 parts; `gpu_update` measures
each), once synchronous and once pipelined
(PipelineRL-1: `rl.max_staleness=1`, the next batch sampled while this one trains).
From each run's metrics.jsonl: the mean of each phase over the steps after the first
(compilation), the memory plan's estimated peak (step 0's line) and the device's
measured peak (the step lines).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import numpy as np

from isojax import metrics, run_dir, storage
from isojax.bench import datasheets
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.run import memory_estimates
from isojax.sampling.settings import cast_weights_dtype

# Qwen2.5-1.5B's shape (Hugging Face config.json: hidden 1536, 28 layers, 12 heads, 2 KV
# heads, MLP 8960, vocabulary 151,936, tied embeddings, rope theta 1e6).
QWEN25_1P5B = dict(vocab_size=151936, num_layers=28, embed_dim=1536, num_heads=12,
                   num_kv_heads=2, head_dim=128, mlp_dim=8960, qkv_bias=True,
                   tie_embeddings=True, rope_theta=1e6)
PROBLEMS, ROLLOUTS, NEW_TOKENS, STEPS = 8, 16, 512, 4
RECIPES = (("synchronous", ()), ("pipelined (PipelineRL-1)", ("--config.rl.max_staleness=1",)))
_ARITHMETIC_TOKENIZER = ("tokenizer.json", "tokenizer_config.json")
# The sampler's weights under bfloat16 activations (`cast_weights_dtype`).
_SAMPLER_WEIGHT_BYTES = 2 if cast_weights_dtype("", "bfloat16") == "bfloat16" else 4
_SHAPE_FIELDS = ("vocab_size", "num_layers", "embed_dim", "num_heads", "num_kv_heads",
                 "head_dim", "mlp_dim", "tie_embeddings")


def write_policy(path: str, shape: dict[str, Any], seed: int = 0) -> None:
  """A random-weight checkpoint of `shape` with the arithmetic task's tokenizer, its
  vocabulary padded with tokens that decode to no digit."""
  # pylint: disable=g-import-not-at-top
  from flax import nnx
  from isojax.models import hf_checkpoint
  from isojax.models.transformer import ModelConfig, Transformer
  # pylint: enable=g-import-not-at-top
  source = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "base_models",
                        "arithmetic")
  partial = path + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  hf_checkpoint.save_model(Transformer(ModelConfig(**shape), rngs=nnx.Rngs(seed)), partial,
                           eos_token_id=2, bos_token_id=1, pad_token_id=0)
  for name in _ARITHMETIC_TOKENIZER:
    shutil.copyfile(os.path.join(source, name), os.path.join(partial, name))
  file = os.path.join(partial, "tokenizer.json")
  with open(file) as f:
    tok = json.load(f)
  vocab = tok["model"]["vocab"]
  vocab.update({filler_token(i): i for i in range(len(vocab), shape["vocab_size"])})
  with open(file, "w") as f:
    json.dump(tok, f)
  os.replace(partial, path)


def filler_token(i: int) -> str:
  """A padding token's text: `i` in base 26 as letters, so it holds no digit."""
  letters = ""
  while True:
    i, r = divmod(i, 26)
    letters = chr(ord("a") + r) + letters
    if not i:
      return f"<{letters}>"


def run_fields(policy: str, steps: int, problems: int, rollouts: int, new_tokens: int
               ) -> dict[str, Any]:
  """The fields one measured run sets over configs/hard.py, by dotted name (the one
  place for them: `run_flags` and `gpu_update` read them)."""
  return {"base_model.path": policy, "model.dtype": "bfloat16", "model.remat": "full",
          "model.attention_impl": "auto",
          "num_steps": steps, "problems_per_batch": problems,
          "rollouts_per_problem": rollouts, "sampling.max_new_tokens": new_tokens,
          "task.num_val": 8, "eval.train_problems": 0, "eval.schedule": "linear",
          "eval.every": steps, "checkpoint_every": steps, "checkpoint_keep": 1,
          "metric_writers.tensorboard": False}


def run_flags(policy: str, steps: int, problems: int, rollouts: int, new_tokens: int
              ) -> list[str]:
  """`isojax.main` flags (over configs/hard.py) of one measured run."""
  return [f"--config.{name}={value}" for name, value in
          run_fields(policy, steps, problems, rollouts, new_tokens).items()]


def summarize(workdir: str) -> dict[str, Any]:
  """Mean phase seconds over the steps after the first, the planned and measured peaks."""
  lines = run_dir.read_metrics(workdir)
  steps = [r for r in lines if r[run_dir.STEP] > 1]
  if not steps:
    raise ValueError(f"{workdir}: no step after the first to average")
  mean = lambda key: float(np.mean([r[key] for r in steps])) if key in steps[0] else None
  peaks = [r[metrics.MEMORY_DEVICE_PEAK] for r in lines if metrics.MEMORY_DEVICE_PEAK in r]
  return dict(steps=len(steps), step_s=mean(metrics.TIME_STEP),
              sample_s=mean("time/sample_s"), update_s=mean("time/update_s"),
              rollout_wait_s=mean(metrics.TIME_ROLLOUT_WAIT),
              tokens_per_step=float(np.mean(np.diff([r["tokens"] for r in lines]))),
              planned_gib=lines[0].get(metrics.MEMORY_PLANNED),
              device_peak_gib=max(peaks) if peaks else None)


def _cell(value: float | None, fmt: str) -> str:
  return "n/a" if value is None else format(value, fmt)


def table(results: dict[str, dict[str, Any]]) -> list[str]:
  rows = ["| recipe | step (s) | sampling (s) | update (s) | waited for rollouts (s) | "
          "tokens per step | planned peak (GiB) | measured peak (GiB) |",
          "|---|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    rows.append(f"| {name} | {r['step_s']:.2f} | {_cell(r['sample_s'], '.2f')} | "
                f"{r['update_s']:.2f} | {_cell(r['rollout_wait_s'], '.2f')} | "
                f"{r['tokens_per_step']:,.0f} | {_cell(r['planned_gib'], '.1f')} | "
                f"{_cell(r['device_peak_gib'], '.1f')} |")
  return rows


def limits(r: dict[str, Any], shape: memory_estimates.Shape, *, rows: int, new_tokens: int,
           device_kind: str, weight_itemsize: int = 4, cache_itemsize: int = 2
           ) -> dict[str, Any]:
  """One recipe's phases against the chip's limits, from its `summarize` figures.

  Update: model FLOPs 6 x parameters x the step's response tokens (forward and
  backward; the prompts' few tokens and the old-log-prob pass left out, so the MFU is a
  lower bound) over the update's seconds, against the datasheet bfloat16 peak.
  Sampling: one decode step reads every weight at the sampler's dtype
  (`weight_itemsize` bytes: bfloat16 under bfloat16 activations by default) and the generated tokens' KV caches at half
  the response length (their mean over the decode; the shared prompts' caches, under
  0.1% of the bytes at this shape, left out); its time is the sampling seconds over
  `new_tokens` steps. Other: the step's seconds
  outside the update and the sampling (or, pipelined, the wait for it): host work,
  grading, transfers, evaluation's share.
  """
  per_position = shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * cache_itemsize
  decode_bytes = shape.params * weight_itemsize + rows * (new_tokens / 2) * per_position
  update_flops = 6 * shape.params * r["tokens_per_step"]
  peak_flops = datasheets.nominal_flops(device_kind)
  bandwidth = datasheets.nominal_bandwidth(device_kind)
  decode_s = None if r["sample_s"] is None else r["sample_s"] / new_tokens
  waited = r["rollout_wait_s"] if r["rollout_wait_s"] is not None else r["sample_s"]
  return dict(
      update_tflops=update_flops / r["update_s"] / 1e12,
      mfu=None if peak_flops is None else update_flops / r["update_s"] / peak_flops,
      decode_ms=None if decode_s is None else decode_s * 1e3,
      decode_gib=decode_bytes / 2**30,
      bandwidth_fraction=(None if decode_s is None or bandwidth is None
                          else decode_bytes / decode_s / bandwidth),
      other_s=None if waited is None else r["step_s"] - r["update_s"] - waited)


def limits_table(results: dict[str, dict[str, Any]], device_kind: str) -> list[str]:
  peak, bandwidth = datasheets.nominal_flops(device_kind), datasheets.nominal_bandwidth(
      device_kind)
  rows = [f"Against the chip's limits ({device_kind}: datasheet bfloat16 peak "
          f"{_cell(None if peak is None else peak / 1e12, '.0f')} TFLOP/s, HBM "
          f"{_cell(None if bandwidth is None else bandwidth / 1e12, '.2f')} TB/s; "
          "`gpu.limits` says how each figure is counted):", "",
          "| recipe | update (model TFLOP/s) | update MFU | decode step (ms) | "
          "read per decode step (GiB) | of nominal bandwidth | other (s) |",
          "|---|---|---|---|---|---|---|"]
  for name, r in results.items():
    rows.append(f"| {name} | {r['update_tflops']:.1f} | {_cell(r['mfu'], '.1%')} | "
                f"{_cell(r['decode_ms'], '.2f')} | {r['decode_gib']:.2f} | "
                f"{_cell(r['bandwidth_fraction'], '.1%')} | {_cell(r['other_s'], '.2f')} |")
  return rows


def run(inv: tables.Invocation, shape: dict[str, Any] | None = None, *,
        steps: int = STEPS, problems: int = PROBLEMS, rollouts: int = ROLLOUTS,
        new_tokens: int = NEW_TOKENS) -> str:
  """gpu.md; returns its path. Refuses a machine without an accelerator."""
  # This process writes the policy (on the host) and the tables: it must not take the
  # accelerator's memory from the runs it starts, which allocate as usual.
  child_env = dict(os.environ)
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  import jax  # pylint: disable=g-import-not-at-top
  if shape is None:
    if all(d.platform == "cpu" for d in jax.devices()):
      raise RuntimeError("the gpu section measures an accelerator; this machine has none")
    shape = QWEN25_1P5B
  section = os.path.join(inv.out, "gpu")
  policy = os.path.join(section, "policy")
  if not os.path.isdir(policy):
    with jax.default_device(jax.devices("cpu")[0]):
      write_policy(policy, shape)
  shape_of = memory_estimates.Shape(**{f: shape[f] for f in _SHAPE_FIELDS})
  params = shape_of.params
  device_kind = jax.devices()[0].device_kind
  intro = (
      f"RL steps of a policy of Qwen2.5-1.5B's shape (about {params / 1e9:.2f}B parameters, "
      "random weights; `isojax/reproduce/gpu.py` says why random weights measure the same "
      f"work) on the arithmetic task: configs/hard.py, {problems} problems x {rollouts} "
      f"rollouts of {new_tokens} new tokens per step, bfloat16 activations, float32 weights "
      "and AdamW, layers rematerialised (`model.remat=full`; the gpu_update section measures "
      f"it against none), bfloat16 sampling weights. Each figure is the mean of steps 2-{steps} (step 1 compiles). The planned "
      "peak is `isojax.run.memory_plan`'s estimate for the run (what it sizes the passes "
      "from); the measured one is the device allocator's peak over the run "
      "(`memory/device_peak_gib`), its step-0 evaluation included.")
  results, wall_s, path = {}, 0.0, ""
  for name, extra in RECIPES:
    workdir = os.path.join(section, name.split()[0])
    wall_s += runs_lib.run_main(inv, "configs/hard.py", workdir, "0",
                                [*run_flags(policy, steps, problems, rollouts, new_tokens),
                                 *extra], env=child_env)
    results[name] = summarize(workdir)
    results[name].update(limits(results[name], shape_of, rows=problems * rollouts,
                                new_tokens=new_tokens, device_kind=device_kind,
                                weight_itemsize=_SAMPLER_WEIGHT_BYTES))
    shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)  # disk
    storage.write_json(os.path.join(section, "results.json"), results)
    # Written after each recipe, so a run cut short keeps the rows it measured.
    path = tables.write(inv, "gpu.md", "RL steps at 1.5B on an accelerator: time and memory",
                        wall_s, "\n".join([intro, "", *table(results), "",
                                            *limits_table(results, device_kind), ""]))
  return path
