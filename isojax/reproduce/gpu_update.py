"""The gpu_update section, for a machine with an accelerator: the update of the gpu
section's step (`update.train_step`, a policy of Qwen2.5-1.5B's shape, B_p x n rollouts
of `gpu.NEW_TOKENS` tokens, bfloat16 activations, float32 weights and AdamW, the
hard recipe's loss) under each setting that decides its speed, and a profile of the
gpu section's own setting.

Each variant is the model's `remat`, `lm_head_precision` and `attention_impl`, with the
micro-batch and the LM-head chunk that `memory_plan` derives for it on this device (as
a run would; two variants set the chunk by hand); the reference model's forward
(`update.score`, the KL log's pass) is timed beside it.
The measurements run in a child process (`python -m isojax.reproduce.gpu_update`), so
the parent holds no accelerator memory; each variant is compiled ahead of time and
timed on its second call; variants left when `--budget_s` runs out are reported as not
run. Model FLOPs are 6 x parameters x response tokens, as `gpu.limits` counts them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from isojax import storage
from isojax.bench import datasheets, op_profile
from isojax.config import run_settings
from isojax.configs import hard
from isojax.models import hf_checkpoint, sharding
from isojax.models.transformer import abstract_model
from isojax.reproduce import gpu, tables
from isojax.rl import optimizer, update
from isojax.run import memory_estimates, memory_plan

# (name, model.remat, model.lm_head_precision, model.attention_impl, LM-head chunk in
# positions, 0 for the plan's). The first is what the gpu section runs, and is
# profiled; then a remat policy that keeps the projections' outputs rather than
# recomputing them (the plan counts what it keeps, so its micro-batch fits), what each
# of the section's settings buys, then the older settings, as long as the budget lasts.
VARIANTS = (("full remat, bf16x2 head, attention auto, the plan's LM-head chunk", "full",
             "bf16x2", "auto", 0),
            ("projections' outputs saved (dots_with_no_batch_dims_saveable), bf16x2 "
             "head, attention auto, the plan's LM-head chunk", "dots_with_no_batch_dims_saveable",
             "bf16x2", "auto", 0),
            ("full remat, bf16x2 head, XLA attention, LM-head chunks of 16 (the gpu "
             "section's before)", "full", "bf16x2", "xla", 16),
            ("full remat, bf16x2 head, cuDNN attention, LM-head chunks of 128", "full",
             "bf16x2", "cudnn", 128),
            ("full remat, bf16x2 head, XLA attention", "full", "bf16x2", "xla", 0),
            ("no remat, bf16x2 head", "none", "bf16x2", "auto", 0),
            ("full remat, float32 head products", "full", "highest", "auto", 0))
PROMPT_LEN = 32   # about the arithmetic prompts' padded length in the gpu section
BUDGET_S = 180.0  # the child's time before it starts no more variants
TOP_OPS = 12


def _hard_settings(policy: str, allocation: tuple[int, int, int] = (
    gpu.PROBLEMS, gpu.ROLLOUTS, gpu.NEW_TOKENS)):
  """configs/hard.py with the gpu section's run fields (bfloat16 activations, and by
  default its allocation: problems, rollouts per problem, response tokens)."""
  config = hard.get_config()
  config.update_from_flattened_dict(gpu.run_fields(policy, gpu.STEPS, *allocation))
  return run_settings.RunSettings.from_config(config)


def _fresh_state(policy: str, tx):
  """(model config, mesh, [params, opt_state]): the policy as loaded and its optimizer
  state, the carry the update donates."""
  model = hf_checkpoint.load_model(policy, dtype="bfloat16")
  _, params = nnx.split(model)
  mesh = jax.tree.leaves(params)[0].sharding.mesh
  opt_state = jax.jit(tx.init, out_shardings=optimizer.opt_state_shardings(tx, params, mesh))(
      params)
  return model.cfg, mesh, [params, opt_state]


def measure(policy: str, budget_s: float = BUDGET_S, profile_dir: str = "", *,
            out_path: str = "", variants: tuple = VARIANTS,
            allocation: tuple[int, int, int] = (gpu.PROBLEMS, gpu.ROLLOUTS, gpu.NEW_TOKENS)
            ) -> dict[str, Any]:
  """Every variant's update and reference-pass seconds on this process's first device,
  and (with `profile_dir`) the first variant's device time by op.

  A variant that fails (out of memory, or a setting this device cannot run) is recorded
  with its error and the next one runs, on a freshly loaded policy where the failed call
  had consumed the donated one. With `out_path`, the result so far is written after
  each variant, so what was measured survives a child that dies."""
  deadline = time.time() + budget_s
  s = _hard_settings(policy, allocation)
  tx, _ = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                   warmup_steps=0, updates_per_step=1)
  cfg, mesh, carry = _fresh_state(policy, tx)
  device = jax.devices()[0]
  available = int((device.memory_stats() or {}).get("bytes_limit", 0)) or 64 * 2**30
  rows, new = s.rollouts_per_step, s.sampling.max_new_tokens
  batch = _batch(s, cfg.vocab_size, rows, PROMPT_LEN, new, mesh)
  base = update.UpdateSettings.derive(s.rl, s.sampling, group_size=s.rollouts_per_problem,
                                      prompt_len=PROMPT_LEN)
  shape = memory_estimates.Shape.of(cfg)
  out = dict(device=device.device_kind, available_gib=available / 2**30,
             params=shape.params, rows=rows, prompt_len=PROMPT_LEN, new_tokens=new,
             peak_flops=datasheets.nominal_flops(device.device_kind), variants=[])
  for name, remat, head, attention, chunk in variants:
    entry = dict(name=name, remat=remat, head=head)
    if time.time() > deadline:
      entry["skipped"] = True
    else:
      profile = "" if out["variants"] else profile_dir  # the first variant's
      try:  # the plan too: one that cannot fit the device is this variant's failure
        vcfg = dataclasses.replace(cfg, remat=remat, lm_head_precision=head,
                                   attention_impl=attention)
        passes = memory_plan.for_settings(s, vcfg, prompt_len=PROMPT_LEN, available=available,
                                          kind="accelerator").passes
        settings = dataclasses.replace(base, micro_batch_size=passes.micro_batch_size,
                                       logprob_chunk_size=chunk or passes.logprob_chunk_size)
        entry.update(_time_variant(vcfg, settings, carry, batch, tx, mesh, profile))
        entry["model_tflops"] = 6 * shape.params * rows * new / entry["update_s"] / 1e12
        print(f"{name}: update {entry['update_s']:.2f} s, reference pass "
              f"{entry['score_s']:.2f} s", flush=True)
      except _VARIANT_FAILURES as e:
        entry["error"] = f"{type(e).__name__}: {_first_line(e)}"
        print(f"{name}: failed, {entry['error']}", flush=True)
        if profile:
          out["profile"] = dict(error=f"the profiled variant failed ({entry['error']})")
        if any(x.is_deleted() for x in jax.tree.leaves(carry)):
          carry[:] = _fresh_state(policy, tx)[2]
      if "profile" in entry:
        out["profile"] = entry.pop("profile")
    out["variants"].append(entry)
    if out_path:
      storage.write_json(out_path, out)
  return out


# What a variant may raise and the section survives: XLA's errors (out of memory at
# compile or run time) and a setting this device refuses (cuDNN attention off a GPU).
_VARIANT_FAILURES = (jax.errors.JaxRuntimeError, ValueError)


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [""])[0][:300]


def _time_variant(vcfg, settings, carry: list, batch, tx, mesh, profile_dir: str
                  ) -> dict[str, Any]:
  """One variant: the compiled update's and reference pass's seconds (second calls),
  micro-batch, chunk, compiled temporaries, loss, and the profile with `profile_dir`."""
  vgraph = nnx.graphdef(abstract_model(vcfg))
  result = {}
  with jax.set_mesh(mesh):
    compiled = update.train_step.lower(vgraph, carry[0], carry[1], batch, tx=tx,
                                       settings=settings).compile()
    seconds = []
    for _ in range(2):
      start = time.time()
      stats = jax.block_until_ready(_step(compiled, carry, batch))
      seconds.append(time.time() - start)
    if profile_dir:
      result["profile"] = _profile(lambda: _step(compiled, carry, batch), profile_dir)
    score = update.score.lower(vgraph, carry[0], batch.tokens, batch.mask,
                               prompt_len=PROMPT_LEN, temperature=settings.temperature,
                               micro_batch_size=settings.micro_batch_size,
                               chunk_size=settings.logprob_chunk_size).compile()
    score_s = []
    for _ in range(2):
      start = time.time()
      jax.block_until_ready(score(carry[0], batch.tokens, batch.mask))
      score_s.append(time.time() - start)
  memory = compiled.memory_analysis()
  rows = batch.tokens.shape[0]
  return dict(result, micro_batch=settings.micro_batch_size or rows,
              chunk=settings.logprob_chunk_size or batch.response_mask.shape[1],
              update_s=seconds[-1], score_s=score_s[-1],
              temp_gib=None if memory is None else memory.temp_size_in_bytes / 2**30,
              loss=float(stats["loss"]))


def _step(compiled, carry: list, batch):
  """One call of the compiled update on `carry` = [params, opt_state], whose buffers
  it donates: the new ones replace them."""
  carry[0], carry[1], stats = compiled(carry[0], carry[1], batch)
  return stats


def _batch(s, vocab: int, rows: int, prompt: int, new: int, mesh):
  """A rollout batch of random tokens, every response at the length cap."""
  rng = np.random.default_rng(0)
  put = lambda x: jax.device_put(x, sharding.batch_sharding(mesh, x.ndim))
  full = lambda shape, value, dtype: put(np.full(shape, value, dtype))
  in_pass = s.rl.old_logp_known
  return update.TrainBatch(
      tokens=put(rng.integers(3, vocab, (rows, prompt + new)).astype(np.int32)),
      mask=full((rows, prompt + new), True, bool), response_mask=full((rows, new), True, bool),
      sampler_logp=full((rows, new), -2.0, np.float32),
      old_logp=None if in_pass else full((rows, new), -2.0, np.float32),
      ref_logp=full((rows, new), -2.0, np.float32) if s.rl.keeps_reference else None,
      advantages=put(rng.normal(size=rows).astype(np.float32)),
      keep_pg=full((rows,), True, bool), keep_reg=full((rows,), True, bool),
      shuffle_rng=jax.random.key(1))


def _profile(call, logdir: str) -> dict[str, Any]:
  """One call under `jax.profiler.trace`: device milliseconds by op name, busiest first."""
  try:
    return op_times(op_profile.trace(call, logdir))
  except FileNotFoundError as e:  # the profiler wrote nothing
    return dict(error=str(e))


def op_times(data) -> dict[str, Any]:
  """{total_ms, ops: [(name, ms, calls)]} of the events on the first device plane's
  busiest line (a GPU's compute stream), summed by event name."""
  best: dict[str, list] = {}
  for plane in data.planes:
    if not plane.name.startswith("/device:"):
      continue
    for line in plane.lines:
      totals: dict[str, list] = {}
      for event in line.events:
        entry = totals.setdefault(event.name, [0.0, 0])
        entry[0] += event.duration_ns / 1e6
        entry[1] += 1
      if sum(v[0] for v in totals.values()) > sum(v[0] for v in best.values()):
        best = totals
  ranked = sorted(best.items(), key=lambda kv: -kv[1][0])
  return dict(total_ms=sum(v[0] for v in best.values()),
              ops=[(name, ms, calls) for name, (ms, calls) in ranked])


def table(result: dict[str, Any]) -> list[str]:
  peak = result.get("peak_flops")
  rows = ["| variant | micro-batch (rollouts) | LM-head chunk (positions) | compiled temporaries "
          "(GiB) | update (s) | model TFLOP/s | MFU | reference pass (s) |",
          "|---|---|---|---|---|---|---|---|"]
  for v in result["variants"]:
    if v.get("skipped"):
      rows.append(f"| {v['name']} | not run: the section's time ran out | | | | | | |")
      continue
    if "error" in v:
      rows.append(f"| {v['name']} | failed: {v['error'].replace('|', '/')} | | | | | | |")
      continue
    mfu = "n/a" if not peak else f"{v['model_tflops'] * 1e12 / peak:.1%}"
    temp = "n/a" if v["temp_gib"] is None else f"{v['temp_gib']:.1f}"
    rows.append(f"| {v['name']} | {v['micro_batch']} | {v['chunk']} | {temp} | "
                f"{v['update_s']:.2f} | {v['model_tflops']:.0f} | {mfu} | {v['score_s']:.2f} |")
  return rows


def profile_table(profile: dict[str, Any] | None, top: int = TOP_OPS) -> list[str]:
  if not profile or "error" in profile:
    return [f"No profile: {profile.get('error') if profile else 'none was asked for'}."]
  total = profile["total_ms"]
  rows = [f"Device time of one update of the first variant, by op ({total / 1e3:.2f} s on the "
          f"busiest stream; the {top} largest):", "",
          "| op (XLA's kernel name) | ms | calls | share |", "|---|---|---|---|"]
  for name, ms, calls in profile["ops"][:top]:
    rows.append(f"| `{name[:70]}` | {ms:.0f} | {calls} | {ms / total:.1%} |")
  return rows


def run(inv: tables.Invocation) -> str:
  """gpu_update.md; returns its path. Refuses a machine without an accelerator."""
  # The child allocates as runs do; this process only checks the device and writes the
  # policy on the host (the backend starts at the first device query, after this).
  child_env = dict(os.environ)
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
  if all(d.platform == "cpu" for d in jax.devices()):
    raise RuntimeError("the gpu_update section measures an accelerator; this machine has none")
  section = os.path.join(inv.out, "gpu")
  policy = os.path.join(section, "policy")
  if not os.path.isdir(policy):
    with jax.default_device(jax.devices("cpu")[0]):
      gpu.write_policy(policy, gpu.QWEN25_1P5B)
  out = os.path.join(section, "update.json")
  if os.path.exists(out):
    os.remove(out)  # an earlier measurement is not this one's
  start = time.time()
  child = subprocess.run([sys.executable, "-m", "isojax.reproduce.gpu_update",
                          f"--policy={policy}", f"--out={out}",
                          f"--profile_dir={os.path.join(section, 'trace')}"],
                         check=False, cwd=inv.repo, env=child_env)
  if not os.path.exists(out):
    raise RuntimeError(f"the gpu_update child exited with code {child.returncode} before "
                       "it measured any variant (its output is above)")
  result = storage.read_json(out)
  ended = ("" if child.returncode == 0 else
           f" The measuring process died (exit code {child.returncode}) after "
           f"{len(result['variants'])} of {len(VARIANTS)} variants; the rest are missing.")
  intro = (
      f"The update of the gpu section's step ([gpu.md](gpu.md)): `update.train_step` on "
      f"{result['rows']} rollouts of {result['prompt_len']} prompt and "
      f"{result['new_tokens']} response tokens (random ids), a policy of Qwen2.5-1.5B's "
      f"shape ({result['params'] / 1e9:.2f}B parameters), configs/hard.py's loss, bfloat16 "
      "activations, float32 weights and AdamW. Each variant sets `model.remat`, "
      "`model.lm_head_precision` and `model.attention_impl`; its micro-batch and LM-head chunk are what "
      "`isojax.run.memory_plan` derives for it on this device "
      f"({result['available_gib']:.1f} GiB), except the chunks that two of them set by hand. "
      "The first is what the gpu section runs; variants left when the section's time "
      f"({BUDGET_S:.0f} s) ran out are marked not run. Seconds are the second call of the compiled "
      "program; MFU is 6 x parameters x response tokens per second over the datasheet "
      "bfloat16 peak; the reference pass is the frozen base model's forward "
      "(`rl.log_kl_to_base`), outside the update. A variant that failed (out of memory, "
      "or a setting the device refuses) is shown with its error." + ended)
  body = [intro, "", *table(result), "", *profile_table(result.get("profile")), ""]
  return tables.write(inv, "gpu_update.md", "The update at 1.5B on an accelerator: what "
                      "each setting buys", time.time() - start, "\n".join(body))


def main(argv: list[str]) -> None:
  args = dict(a[2:].split("=", 1) for a in argv[1:])
  result = measure(args["policy"], float(args.get("budget_s", BUDGET_S)),
                   args.get("profile_dir", ""), out_path=args["out"])
  print(json.dumps({k: v for k, v in result.items() if k != "profile"}, indent=1))


if __name__ == "__main__":
  main(sys.argv)
