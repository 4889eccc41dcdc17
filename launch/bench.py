r"""Throughput benchmark: isojax's sampler and update against Hugging Face, same weights.

    python -m launch.bench --out=/tmp/bench.json
    python -m launch.bench --hidden=512 --layers=8 --workloads=32x8x64x64 --repeats=5

One random-weight Qwen2-shaped model is built with `transformers`, saved, and loaded
back with `hf_checkpoint.load_model`, so both sides run the same weights (checked:
greedy continuations agree). In one process it measures
  1. sampling: `sampler.sample` (jitted) against `generate` (torch, do_sample, no EOS,
     so every rollout has exactly T tokens) on each --workloads entry G x n x P x T
     (G prompts, n rollouts each, P prompt tokens, T new tokens); Tunix if importable;
  2. the shared prompt cache: isojax at several n for the same G * n rollouts;
  3. length-skewed batches (--skew_rows rows, G = rows / n prompts for each n of
     --skew_n): greedy prompts chosen so ~90% of rows emit a stop id after T / 8 tokens
     and the rest run to T; the static while_loop executes every row until
     the longest finishes, and the waste is 1 - useful / executed decode slots; against
     it, continuous batching in --skew_slots slots, and the same halving its slots down
     to --skew_min_slots as the queue drains (`sampling.decode_slots_min`); the
     prompts' prefill, which every side pays, is timed alone too, so the gain of the
     decoding alone is printed beside that of the whole call;
  4. long outputs: attention over the whole preallocated generated cache at every step
     against blocked attention over its filled part (`sampling.decode_block`);
  5. the update (`update.train_step`): tokens/s, model FLOP/s and its fraction of the
     measured peak of a jitted float32 matmul;
  6. one RL step of the default preset, broken down into its phases (`bench_step`);
  7. decode against the memory-bandwidth roofline (`bench_roofline`), per workload of
     --roofline: bytes of weights and KV cache read per step / step time, against a
     measured copy bandwidth and the device's nominal one where known.
Tokens/s = generated (or trained) tokens / wall seconds of one call, median of
--repeats rounds after a warm-up call (the sides of a comparison called in turn in each
round); compile = warm-up minus that median. --sections picks what runs, e.g. on a GPU:

    python -m launch.bench --sections=roofline --roofline_dtype=bfloat16 \
        --hidden=1536 --layers=28 --heads=12 --kv_heads=2 --intermediate=8960 \
        --vocab=151936 --roofline=1x1x128x512,8x1x128x512,64x1x128x512 \
        --bandwidth_bytes=4294967296
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import dataclasses
import functools
import os
import tempfile
import time
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import torch
import transformers
from absl import app, flags
from flax import nnx

from isojax import storage
from isojax.models import hf_checkpoint
from isojax.rl import update
from isojax.sampling import decode, sampler, settings
from launch import bench_roofline, bench_step, bench_tunix

SECTIONS = ("sampling", "sharing", "skew", "long", "update", "rl_step", "roofline")


@dataclasses.dataclass(frozen=True)
class Options:
  hidden: int = 256
  layers: int = 4
  heads: int = 4
  kv_heads: int = 2
  intermediate: int = 1024
  vocab: int = 8192
  workloads: tuple[str, ...] = ("32x8x64x64", "16x16x256x64")   # G x n x P x T
  share_n: tuple[int, ...] = (1, 4, 16)
  share_rollouts: int = 64
  share_prompt_len: int = 256
  share_new_tokens: int = 64
  skew_rows: int = 256
  skew_n: tuple[int, ...] = (1, 8)   # rollouts per prompt: G = skew_rows / n prompts
  skew_prompt_len: int = 64
  skew_new_tokens: int = 64
  skew_long_fraction: float = 0.1
  skew_candidates: int = 64
  skew_slots: int = 64
  skew_min_slots: int = 8
  long: str = "16x4x64x1024"        # G x n x P x T with long outputs
  long_block: int = 128
  update_batch: int = 256
  update_seq_len: int = 128
  update_prompt_len: int = 64
  matmul_size: int = 2048
  rl_steps: int = 12
  roofline: tuple[str, ...] = ("8x1x64x256",)   # G x n x P x T of the decode-roofline section
  roofline_dtype: str = "float32"   # weights, activations and cache there
  bandwidth_bytes: int = 256 * 2**20
  sections: tuple[str, ...] = SECTIONS
  repeats: int = 3
  seed: int = 0


def parse_workload(spec: str, flag: str = "--workloads entry") -> tuple[int, int, int, int]:
  """'32x8x64x64' -> (G, n, P, T)."""
  parts = spec.split("x")
  if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"{flag} {spec!r}: expected GxNxPxT of positive integers "
                     "(prompts x rollouts per prompt x prompt tokens x new tokens)")
  return tuple(int(p) for p in parts)


@dataclasses.dataclass
class Timing:
  """One measured callable: its first call (compile included) and its timed calls."""
  first_s: float
  times_s: list[float]
  out: Any   # what the last call returned

  @property
  def median_s(self) -> float:
    return float(np.median(self.times_s))


def timed_rounds(fns: Sequence[Callable[[], Any]], repeats: int) -> list[Timing]:
  """Each of `fns` called once (warm-up), then `repeats` rounds calling each once in turn.

  Interleaved rather than one fn's calls after another's: a machine's speed drifts over
  minutes, and within a round every fn meets the same drift, so
  per-round ratios (`round_ratio`) cancel it where a ratio of separate medians would not.
  """
  first, outs = [], []
  for fn in fns:
    start = time.perf_counter()
    outs.append(fn())
    first.append(time.perf_counter() - start)
  times = [[] for _ in fns]
  for _ in range(max(repeats, 1)):
    for i, fn in enumerate(fns):
      start = time.perf_counter()
      outs[i] = fn()
      times[i].append(time.perf_counter() - start)
  return [Timing(f, t, o) for f, t, o in zip(first, times, outs)]


def round_ratio(fast: Timing, slow: Timing, work_ratio: float = 1.0) -> float:
  """Median over rounds of slow's seconds / fast's: how many times faster `fast` is
  (rates with `work_ratio` = fast's work / slow's when they do different amounts)."""
  return float(np.median(np.asarray(slow.times_s) / np.asarray(fast.times_s))) * work_ratio


def decode_ratio(fast: Timing, slow: Timing, prefill: Timing) -> float:
  """`round_ratio` of the two calls' walls less the round's prefill: what the sides'
  decoding alone gains, the prompts' prefill (the same work on both sides) left out."""
  less = lambda t: dataclasses.replace(t, times_s=list(np.subtract(t.times_s, prefill.times_s)))
  return round_ratio(less(fast), less(slow))


def build_checkpoint(path: str, o: Options) -> transformers.PreTrainedModel:
  """A random-weight Qwen2ForCausalLM saved to `path`; returns it in eval mode."""
  torch.manual_seed(o.seed)
  cfg = transformers.Qwen2Config(
      vocab_size=o.vocab, hidden_size=o.hidden, intermediate_size=o.intermediate,
      num_hidden_layers=o.layers, num_attention_heads=o.heads, num_key_value_heads=o.kv_heads,
      max_position_embeddings=4096, tie_word_embeddings=False)
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  model.save_pretrained(path, safe_serialization=True)
  return model


def param_counts(hf_model) -> dict[str, int]:
  """Parameters of the decoder body (layers, final norm), the LM head, the embedding."""
  counts = dict(body=0, head=0, embed=0)
  for name, p in hf_model.named_parameters():
    part = "head" if name.startswith("lm_head") else "embed" if "embed_tokens" in name else "body"
    counts[part] += p.numel()
  return counts


def random_prompts(rng: np.random.Generator, g: int, p: int, vocab: int) -> np.ndarray:
  return rng.integers(1, vocab, size=(g, p)).astype(np.int32)   # [G, P], no padding


def isojax_sample(model, prompts_GP, *, n, new_tokens, temperature=1.0, stop_ids=(),
                  num_slots=0, min_slots=0, decode_block=0, weights_dtype=None, dtype=None):
  """Rollouts of `sampler.sample` (B = G * n rows), computed before returning."""
  graphdef, state = model
  spec = sampler.SampleSpec(n=n, max_new_tokens=new_tokens, temperature=temperature,
                            stop_ids=tuple(stop_ids), pad_id=0, num_slots=num_slots,
                            min_slots=min_slots, decode_block=decode_block,
                            weights_dtype=weights_dtype, dtype=dtype)
  return jax.block_until_ready(sampler.sample(
      graphdef, state, jnp.asarray(prompts_GP), jnp.ones(prompts_GP.shape, bool),
      jax.random.key(0), spec))


@functools.partial(jax.jit, static_argnums=0)
def _prefill(graphdef, state, prompts_GP):
  return decode.prefill(nnx.merge(graphdef, state), prompts_GP,
                        jnp.ones(prompts_GP.shape, bool))


def isojax_prefill(model, prompts_GP):
  """The prompts' prefill alone (`decode.prefill`, which `sampler.sample` starts
  with), computed before returning."""
  return jax.block_until_ready(_prefill(*model, jnp.asarray(prompts_GP)))


def hf_device() -> str:
  """Where Hugging Face runs: the GPU when torch sees one (as JAX then does), else CPU."""
  return "cuda" if torch.cuda.is_available() else "cpu"


def hf_sample(hf_model, prompts_GP, *, n, new_tokens, do_sample=True) -> np.ndarray:
  """New tokens [G * n, T] of `generate` on the model's device; no EOS id, so every row
  has T of them (copied to the host, which waits for the device)."""
  torch.manual_seed(0)
  ids = torch.as_tensor(prompts_GP, dtype=torch.long, device=hf_model.device)
  # top_k=0 and top_p=1 switch off generate's default truncation, as isojax is called.
  policy = (dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0) if do_sample
            else dict(do_sample=False))
  with torch.inference_mode():
    out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                            num_return_sequences=n, eos_token_id=None, pad_token_id=0, **policy)
  new = out[:, ids.shape[1]:].cpu().numpy()
  if new.shape != (len(prompts_GP) * n, new_tokens):
    raise RuntimeError(f"generate returned new tokens {new.shape}, "
                       f"expected {(len(prompts_GP) * n, new_tokens)}")
  return new


def rate(tokens: int, t: Timing) -> dict:
  return dict(tokens=tokens, median_s=t.median_s, tokens_per_s=tokens / t.median_s,
              compile_s=max(t.first_s - t.median_s, 0.0), times_s=t.times_s)


def bench_sampling(model, hf_model, spec: str, o: Options, rng, tunix=None) -> dict:
  """isojax vs HF (vs Tunix, given a `bench_tunix.load` handle) tokens/s on one
  G x n x P x T workload, the sides' calls interleaved (`timed_rounds`)."""
  g, n, p, t = parse_workload(spec)
  prompts = random_prompts(rng, g, p, o.vocab)
  fns = [lambda: isojax_sample(model, prompts, n=n, new_tokens=t),
         lambda: hf_sample(hf_model, prompts, n=n, new_tokens=t)]
  if tunix is not None:
    fns.append(lambda: bench_tunix.sample(tunix, prompts, n, t))
  ours_t, hf_t, *tunix_t = timed_rounds(fns, o.repeats)
  ours = rate(int(ours_t.out.mask.sum()), ours_t)
  hf = rate(int(hf_t.out.size), hf_t)
  theirs = rate(int(tunix_t[0].out.size), tunix_t[0]) if tunix_t else None
  return dict(workload=spec, groups=g, n=n, prompt_len=p, new_tokens=t, isojax=ours, hf=hf,
              tunix=theirs, ratio=round_ratio(ours_t, hf_t, ours["tokens"] / hf["tokens"]),
              tunix_ratio=None if theirs is None
              else round_ratio(ours_t, tunix_t[0], ours["tokens"] / theirs["tokens"]))


def bench_sharing(model, o: Options, rng) -> list[dict]:
  """isojax tokens/s for the same G * n rollouts at each n of `o.share_n`, with each
  n's rate against the first n's (`vs_first`, per-round ratio)."""
  fns = []
  for n in o.share_n:
    if o.share_rollouts % n:
      raise ValueError(f"--share_rollouts={o.share_rollouts} is not a multiple of n={n}")
    prompts = random_prompts(rng, o.share_rollouts // n, o.share_prompt_len, o.vocab)
    fns.append(lambda prompts=prompts, n=n: isojax_sample(model, prompts, n=n,
                                                          new_tokens=o.share_new_tokens))
  timings = timed_rounds(fns, o.repeats)
  rows = [dict(n=n, groups=o.share_rollouts // n, **rate(int(t.out.mask.sum()), t))
          for n, t in zip(o.share_n, timings)]
  for row, t in zip(rows, timings):
    row["vs_first"] = round_ratio(t, timings[0], row["tokens"] / rows[0]["tokens"])
  return rows


def slot_waste(mask_BT: np.ndarray) -> dict:
  """Decode slots the static loop executes (every row until the longest stops) vs used."""
  lengths = np.asarray(mask_BT).sum(-1)
  executed = int(mask_BT.shape[0] * lengths.max())
  useful = int(lengths.sum())
  return dict(useful_slots=useful, executed_slots=executed,
              waste_fraction=1.0 - useful / executed)


def find_skew_prompts(tokens_CT: np.ndarray, short_len: int):
  """(short index, long index, stop id) among greedy continuations [C, T] of C prompts.

  The short prompt's token at slot short_len - 1 is the stop id and absent before it;
  the long prompt's continuation never contains it.
  """
  for i, row in enumerate(tokens_CT):
    stop = int(row[short_len - 1])
    if stop in row[:short_len - 1]:
      continue
    for j, other in enumerate(tokens_CT):
      if j != i and stop not in other:
        return i, j, stop
  raise ValueError(f"no pair of the {len(tokens_CT)} candidate prompts gives a short and a "
                   "long greedy rollout; raise --skew_candidates")


def skew_short_len(o: Options) -> int:
  """Tokens of the skew's short rollouts (stop id included): T / 8."""
  return max(o.skew_new_tokens // 8, 1)


def bench_skew(model, o: Options, rng) -> list[dict]:
  """Greedy batches of `skew_rows` rows: ~90% stop after T / 8 tokens, the rest (in random
  places) run to T. Lockstep decoding against continuous batching in `skew_slots` slots,
  once per entry of `skew_n` (rollouts per prompt: G = skew_rows / n prompts)."""
  candidates = random_prompts(rng, o.skew_candidates, o.skew_prompt_len, o.vocab)
  greedy = np.asarray(isojax_sample(model, candidates, n=1, new_tokens=o.skew_new_tokens,
                                    temperature=0).tokens)
  i, j, stop = find_skew_prompts(greedy, skew_short_len(o))
  return [_skew_batch(model, candidates, i, j, stop, n, o, rng) for n in o.skew_n]


def _skew_batch(model, candidates, i, j, stop, n, o: Options, rng) -> dict:
  """One skew batch of G = skew_rows / n prompts, n greedy rollouts each: a prompt's
  rollouts are identical, so the rows skew by prompt (G copies of prompt i or j)."""
  t, short_len, g = o.skew_new_tokens, skew_short_len(o), o.skew_rows // n
  num_long = max(round(o.skew_long_fraction * g), 1)
  prompts = candidates[rng.permutation([i] * (g - num_long) + [j] * num_long)]
  run = lambda stops, slots=0, min_slots=0: isojax_sample(
      model, prompts, n=n, new_tokens=t, temperature=0, stop_ids=stops, num_slots=slots,
      min_slots=min_slots)
  min_slots = [0] + ([o.skew_min_slots] if 0 < o.skew_min_slots < o.skew_slots else [])
  prefill, lockstep, full, *cbs = timed_rounds(
      [lambda: isojax_prefill(model, prompts), lambda: run((stop,)),
       lambda: run(())]   # run(()): every row to T, the dense rate
      + [lambda m=m: run((stop,), o.skew_slots, m) for m in min_slots], o.repeats)
  out = lockstep.out
  waste = slot_waste(np.asarray(out.mask))
  full_rate = o.skew_rows * t / full.median_s
  lengths = np.asarray(out.mask).sum(-1)

  def continuous(m: int, cb: Timing) -> dict:
    same = all(np.array_equal(np.asarray(getattr(out, f)), np.asarray(getattr(cb.out, f)))
               for f in ("tokens", "mask", "finished"))
    return dict(slots=o.skew_slots, min_slots=m, same_outputs=same,
                speedup=round_ratio(cb, lockstep),
                decode_speedup=decode_ratio(cb, lockstep, prefill),
                **rate(waste["useful_slots"], cb))
  return dict(rows=o.skew_rows, groups=g, n=n, prompt_len=o.skew_prompt_len, new_tokens=t,
              stop_id=stop, long_fraction=float(np.mean(lengths == t)), short_len=short_len,
              **waste, **rate(waste["useful_slots"], lockstep), full_batch_tokens_per_s=full_rate,
              ideal_s=waste["useful_slots"] / full_rate, prefill_s=prefill.median_s,
              prefill_times_s=prefill.times_s,
              continuous=[continuous(m, cb) for m, cb in zip(min_slots, cbs)])


def bench_long(model, o: Options, rng) -> dict:
  """Long outputs, every rollout to T: attention over all T cache slots at every step
  against blocked attention over the filled ones (`decode_block`), temperature 1."""
  g, n, p, t = parse_workload(o.long)
  prompts = random_prompts(rng, g, p, o.vocab)
  run = lambda block, temperature=1.0: isojax_sample(
      model, prompts, n=n, new_tokens=t, temperature=temperature, decode_block=block)
  whole_t, blocked_t = timed_rounds([lambda: run(0), lambda: run(o.long_block)], o.repeats)
  # Tokens counted from the rollouts.
  whole, blocked = (rate(int(x.out.mask.sum()), x) for x in (whole_t, blocked_t))
  same = np.array_equal(np.asarray(run(0, 0.0).tokens), np.asarray(run(o.long_block, 0.0).tokens))
  return dict(workload=o.long, groups=g, n=n, prompt_len=p, new_tokens=t, block=o.long_block,
              whole_cache=whole, blocked=blocked, same_greedy_outputs=same,
              speedup=round_ratio(blocked_t, whole_t, blocked["tokens"] / whole["tokens"]))


def matmul_peak(size: int, calls: int = 5) -> Callable[[], float]:
  """A callable returning the FLOP/s of the fastest of `calls` jitted float32
  [size, size] x [size, size] matmuls (the first call compiles it)."""
  x = jax.random.normal(jax.random.key(0), (size, size), jnp.float32)
  f = jax.jit(jnp.matmul)
  return lambda: bench_roofline.fastest_rate(lambda: f(x, x), 2 * size**3, calls)


def bench_update(model, counts: dict, o: Options, rng) -> dict:
  """`train_step` on B sequences of S tokens (one minibatch, one epoch, PPO clip)."""
  graphdef, state = model
  b, s, p = o.update_batch, o.update_seq_len, o.update_prompt_len
  tokens = jnp.asarray(rng.integers(1, o.vocab, (b, s)), jnp.int32)
  mask = jnp.ones((b, s), bool)
  logp = update.score(graphdef, state, tokens, mask, prompt_len=p, temperature=1.0)
  batch = update.TrainBatch(
      tokens=tokens, mask=mask, response_mask=jnp.ones((b, s - p), bool), sampler_logp=logp,
      old_logp=logp, ref_logp=logp, advantages=jnp.asarray(rng.normal(size=b), jnp.float32),
      keep_pg=jnp.ones(b, bool), keep_reg=jnp.ones(b, bool), shuffle_rng=jax.random.key(1))
  settings = update.UpdateSettings(
      group_size=1, prompt_len=p, temperature=1.0, policy_loss="ppo_clip", clip_eps=0.2,
      clip_eps_high=0.2, cispo_eps_max=4.0, aggregation="token_mean",
      constant_normalizer=float(s - p), kl_coef=0.0, kl_form="k3", entropy_coef=0.0,
      tis_threshold=2.0, num_minibatches=1, num_epochs=1, log_entropy=False, log_kl=False)
  tx = optax.adam(1e-5)
  params = jax.tree.map(jnp.copy, state)   # train_step donates its parameters
  mesh = jax.tree.leaves(params)[0].sharding.mesh
  # Moments beside their parameters, as `train.run` places them: the step's outputs
  # then match its inputs and the second call does not compile again.
  init = jax.jit(tx.init, out_shardings=update.opt_state_shardings(tx, params, mesh))
  carry = [params, init(params)]

  def step():
    carry[0], carry[1], stats = update.train_step(graphdef, carry[0], carry[1], batch, tx=tx,
                                                  settings=settings)
    return jax.block_until_ready(stats)

  # Forward + backward = 6 FLOPs per parameter per token; the LM head sees only the
  # response positions; attention scores are not counted.
  flops = 6 * (counts["body"] * b * s + counts["head"] * b * (s - p))
  # Each round measures the peak right before its update step and takes the fraction
  # per round: the peak moves with the machine's drift as the step does.
  best = matmul_peak(o.matmul_size)
  peaks = []
  _, timing = timed_rounds([lambda: peaks.append(best()), step], o.repeats)
  peaks = peaks[1:]   # the warm-up round's left out, as its step's time is
  fractions = [flops / sec / peak for sec, peak in zip(timing.times_s, peaks)]
  return dict(batch=b, seq_len=s, prompt_len=p, **rate(b * s, timing), flops=flops,
              flops_per_s=flops / timing.median_s,
              matmul_peak_flops_per_s=float(np.median(peaks)), matmul_peaks=peaks,
              fraction_of_peak=float(np.median(fractions)))


def bench_decode_roofline(model, counts: dict, workload: str, o: Options, rng, *,
                          tied: bool) -> dict:
  """Decode of `workload` (G x n x P x T) at `o.roofline_dtype`: bytes read per step
  over its step time, against the measured copy bandwidth (per round) and the nominal."""
  g, n, p, t = parse_workload(workload, "--roofline entry")
  itemsize = jnp.dtype(o.roofline_dtype).itemsize
  dtype = None if o.roofline_dtype == "float32" else o.roofline_dtype
  prompts = random_prompts(rng, g, p, o.vocab)
  run = lambda new_tokens: isojax_sample(model, prompts, n=n, new_tokens=new_tokens,
                                         weights_dtype=dtype, dtype=dtype)
  best = bench_roofline.copy_bandwidth(o.bandwidth_bytes)
  peaks = []
  _, short, long = timed_rounds([lambda: peaks.append(best()), lambda: run(1), lambda: run(t)],
                                o.repeats)
  peaks = peaks[1:]   # the warm-up round's left out
  steps = [bench_roofline.step_seconds([lt], [st], t)
           for lt, st in zip(long.times_s, short.times_s)]
  read = bench_roofline.decode_bytes(
      weight_bytes=sum(counts.values()) * itemsize, embed_bytes=counts["embed"] * itemsize,
      tied=tied, rows=g * n, groups=g, hidden=o.hidden, layers=o.layers, kv_heads=o.kv_heads,
      head_dim=o.hidden // o.heads, prompt_len=p, cache_len=t, cache_itemsize=itemsize,
      weight_itemsize=itemsize)
  device_kind = jax.devices()[0].device_kind
  nominal = bench_roofline.nominal_bandwidth(device_kind)
  step_s = float(np.median(steps))
  achieved = read["total"] / step_s
  return dict(workload=workload, dtype=o.roofline_dtype, rows=g * n, bytes_per_step=read,
              step_s=step_s, steps_s=steps, bytes_per_s=achieved,
              copy_bytes_per_s=float(np.median(peaks)), copy_peaks=peaks,
              fraction_of_copy=float(np.median([read["total"] / sec / peak
                                                for sec, peak in zip(steps, peaks)])),
              device_kind=device_kind, nominal_bytes_per_s=nominal,
              fraction_of_nominal=None if nominal is None else achieved / nominal)


def same_weights(model, hf_model, o: Options, rng, new_tokens: int = 16) -> bool:
  """Greedy continuations of one prompt agree between isojax and Hugging Face."""
  prompt = random_prompts(rng, 1, 8, o.vocab)
  ours = np.asarray(isojax_sample(model, prompt, n=1, new_tokens=new_tokens, temperature=0).tokens)
  return bool(np.array_equal(ours, hf_sample(hf_model, prompt, n=1, new_tokens=new_tokens,
                                             do_sample=False)))


def tunix_same_weights(model, tunix, o: Options, new_tokens: int = 16) -> bool | None:
  """Greedy continuations of one prompt agree between isojax and Tunix (None: no Tunix)."""
  if tunix is None:
    return None
  # Its own generator: the workloads' prompts do not depend on whether Tunix is installed.
  prompt = random_prompts(np.random.default_rng(o.seed + 1), 1, 8, o.vocab)
  ours = np.asarray(isojax_sample(model, prompt, n=1, new_tokens=new_tokens, temperature=0).tokens)
  return bench_tunix.greedy_matches(tunix, prompt[0], ours[0])


def tunix_status() -> str:
  """Whether Tunix's sampler is measured (the figures are null when it is not)."""
  if not bench_tunix.tunix_available():
    return "tunix: not installed, skipped"
  return (f"tunix: google-tunix {bench_tunix.version()}, vanilla Sampler, each prompt "
          "repeated n times (no shared prompt cache)")


def run(o: Options) -> dict:
  """Every measurement; the JSON-ready figures."""
  print(tunix_status())
  rng = np.random.default_rng(o.seed)
  wanted = set(o.sections)
  with tempfile.TemporaryDirectory(prefix="isojax_bench_") as path:
    hf_model = build_checkpoint(path, o).to(hf_device())
    model = nnx.split(hf_checkpoint.load_model(path))
    tunix = (bench_tunix.load(path) if bench_tunix.tunix_available() and "sampling" in wanted
             else None)
  counts = param_counts(hf_model)
  info = dict(options=dataclasses.asdict(o), params=counts, jax=jax.__version__,
              backend=jax.default_backend(), torch=torch.__version__,
              torch_threads=torch.get_num_threads(), torch_device=hf_device(),
              cpu_count=os.cpu_count(),
              same_weights=same_weights(model, hf_model, o, rng),
              tunix_same_weights=tunix_same_weights(model, tunix, o))
  # Every section in its fixed order (each draws its prompts from the one generator);
  # the ones not asked for are null.
  sections = dict(
      sampling=lambda: [bench_sampling(model, hf_model, w, o, rng, tunix)
                        for w in o.workloads],
      sharing=lambda: bench_sharing(model, o, rng), skew=lambda: bench_skew(model, o, rng),
      long=lambda: bench_long(model, o, rng),
      update=lambda: bench_update(model, counts, o, rng),
      rl_step=lambda: bench_step.breakdown(bench_step.default_config(o.rl_steps))
      if o.rl_steps else None,
      roofline=lambda: [bench_decode_roofline(model, counts, w, o, rng,
                                              tied=hf_model.config.tie_word_embeddings)
                        for w in o.roofline])
  return dict(info, **{name: fn() if name in wanted else None
                       for name, fn in sections.items()})


def _sampling_lines(r: dict, o: dict) -> list[str]:
  lines = [f"sampling: tokens/s, median of {o['repeats']} rounds (each side called once per "
           "round, in turn), compile excluded; ratios: median of per-round ratios",
           f"{'G x n x P x T':<18}{'isojax':>10}{'HF':>10}{'isojax/HF':>11}{'tunix':>8}"
           f"{'isojax/tunix':>14}{'compile s':>11}"]
  for s in r["sampling"]:
    tx = s.get("tunix")
    tunix = (f"{tx['tokens_per_s']:>8.0f}{s['tunix_ratio']:>13.2f}x" if tx
             else f"{'n/a':>8}{'n/a':>14}")
    lines.append(f"{s['workload']:<18}{s['isojax']['tokens_per_s']:>10.0f}"
                 f"{s['hf']['tokens_per_s']:>10.0f}{s['ratio']:>10.2f}x{tunix}"
                 f"{s['isojax']['compile_s']:>11.1f}")
  return lines


def _sharing_lines(r: dict, o: dict) -> list[str]:
  sh = r["sharing"]
  return ([f"shared prompt cache: isojax, {o['share_rollouts']} rollouts, "
           f"P={o['share_prompt_len']}, T={o['share_new_tokens']}",
           f"{'n':>4}{'G':>5}{'tokens/s':>10}{'vs n=' + str(sh[0]['n']):>9}"]
          + [f"{x['n']:>4}{x['groups']:>5}{x['tokens_per_s']:>10.0f}{x['vs_first']:>8.2f}x"
             for x in sh])


def _skew_lines(r: dict, o: dict) -> list[str]:
  return [line for k in r["skew"] for line in _skew_batch_lines(k)]


def _skew_batch_lines(k: dict) -> list[str]:
  lines = [f"length skew: isojax greedy, {k['rows']} rows = {k['groups']} prompts x n="
           f"{k['n']}, P={k['prompt_len']}, T={k['new_tokens']}; "
           f"{100 * (1 - k['long_fraction']):.0f}% stop after {k['short_len']} tokens, "
           f"{100 * k['long_fraction']:.0f}% run to {k['new_tokens']}",
           f"  lockstep: decode slots useful / executed: {k['useful_slots']} / "
           f"{k['executed_slots']} -> waste {100 * k['waste_fraction']:.1f}%",
           f"  lockstep wall {k['median_s']:.2f} s ({k['tokens_per_s']:.0f} useful tokens/s); "
           f"at the dense rate ({k['full_batch_tokens_per_s']:.0f} tokens/s) the useful "
           f"tokens would take {k['ideal_s']:.2f} s"]
  for cb in k["continuous"]:
    halving = f" halving down to {cb['min_slots']}" if cb["min_slots"] else ""
    lines.append(f"  continuous batching, {cb['slots']} slots{halving}: wall "
                 f"{cb['median_s']:.2f} s ({cb['tokens_per_s']:.0f} useful tokens/s) -> "
                 f"{cb['speedup']:.2f}x lockstep; same greedy outputs: {cb['same_outputs']}")
  lines.append(f"  the prefill of the {k['groups']} prompts, in both sides' wall: "
               f"{k['prefill_s']:.2f} s; without it, decoding alone -> "
               + ", ".join(f"{cb['decode_speedup']:.2f}x" for cb in k["continuous"])
               + " lockstep (same order)")
  return lines


def _long_lines(r: dict, o: dict) -> list[str]:
  lg = r["long"]
  return [f"long outputs: isojax, {lg['workload']} (G x n x P x T), temperature 1, every "
          "rollout to T", f"  whole cache every step {lg['whole_cache']['tokens_per_s']:.0f} "
          f"tokens/s; blocked (decode_block={lg['block']}) {lg['blocked']['tokens_per_s']:.0f} "
          f"tokens/s -> {lg['speedup']:.2f}x; same greedy outputs: {lg['same_greedy_outputs']}"]


def _update_lines(r: dict, o: dict) -> list[str]:
  u = r["update"]
  return [f"update: train_step, {u['batch']} x {u['seq_len']} tokens "
          f"(P={u['prompt_len']}), FLOPs = 6 * (body params * B * S + head params * B * T)",
          f"  {u['tokens_per_s']:.0f} tokens/s, {u['flops_per_s'] / 1e9:.1f} GFLOP/s; "
          f"float32 {o['matmul_size']}^2 matmul peak {u['matmul_peak_flops_per_s'] / 1e9:.1f}"
          f" GFLOP/s (best of 5 calls before each step) -> {100 * u['fraction_of_peak']:.1f}%"
          " of peak (median of per-round fractions)"]


def _rl_step_lines(r: dict, o: dict) -> list[str]:
  return bench_step.format_breakdown(r["rl_step"], "configs/hard.py (the default)")


def _roofline_lines(r: dict, o: dict) -> list[str]:
  return [line for f in r["roofline"] for line in _roofline_workload_lines(f, o)]


def _roofline_workload_lines(f: dict, o: dict) -> list[str]:
  read = f["bytes_per_step"]
  nominal = ("no nominal figure for this device" if f["nominal_bytes_per_s"] is None else
             f"nominal {f['nominal_bytes_per_s'] / 1e9:.0f} GB/s -> "
             f"{100 * f['fraction_of_nominal']:.1f}% of it")
  return [f"decode roofline: isojax, {f['workload']} (G x n x P x T), {f['dtype']}, "
          f"{f['rows']} rows, on {f['device_kind']}",
          f"  bytes read per step {read['total'] / 2**20:.1f} MiB (weights "
          f"{read['weights'] / 2**20:.1f}, prompt cache {read['prefix_cache'] / 2**20:.1f}, "
          f"generated cache {read['generated_cache'] / 2**20:.1f}); step "
          f"{1e3 * f['step_s']:.2f} ms -> {f['bytes_per_s'] / 1e9:.1f} GB/s",
          f"  measured copy bandwidth (x * 2 over {o['bandwidth_bytes'] / 2**20:.0f} MiB, best "
          f"of 5 before each round) {f['copy_bytes_per_s'] / 1e9:.1f} GB/s -> "
          f"{100 * f['fraction_of_copy']:.1f}% of it; {nominal}"]


_SECTION_LINES = dict(sampling=_sampling_lines, sharing=_sharing_lines, skew=_skew_lines,
                      long=_long_lines, update=_update_lines, rl_step=_rl_step_lines,
                      roofline=_roofline_lines)


def format_table(r: dict) -> str:
  """The figures of `run` as a compact text table (the sections that ran)."""
  o, c = r["options"], r["params"]
  tunix_same = "n/a" if r.get("tunix_same_weights") is None else r["tunix_same_weights"]
  lines = [f"model: Qwen2-shaped, random weights, {sum(c.values()) / 1e6:.1f}M params "
           f"(hidden {o['hidden']}, {o['layers']} layers, {o['heads']} heads, {o['kv_heads']} kv "
           f"heads, mlp {o['intermediate']}, vocab {o['vocab']}), float32; same weights: "
           f"{r['same_weights']} (tunix: {tunix_same}); jax {r['jax']} ({r['backend']}), "
           f"torch {r['torch']} ({r['torch_threads']} threads"
           f"{'' if r['torch_device'] == 'cpu' else ', HF on ' + r['torch_device']}), "
           f"{r['cpu_count']} CPUs"]
  for name, section in _SECTION_LINES.items():
    if r.get(name):
      lines += [""] + section(r, o)
  return "\n".join(lines)


def options_from_flags() -> Options:
  kw = {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(Options)}
  for name in ("share_n", "skew_n"):
    if not all(x.isdigit() and int(x) > 0 for x in kw[name]):
      raise app.UsageError(f"--{name}={','.join(kw[name])}: expected positive integers")
  return Options(**dict(kw, share_n=tuple(map(int, kw["share_n"])),
                        skew_n=tuple(map(int, kw["skew_n"])),
                        workloads=tuple(kw["workloads"]), roofline=tuple(kw["roofline"]),
                        sections=tuple(kw["sections"])))


def check_options(o: Options) -> None:
  """Raises ValueError naming the flag of the first bad option (before anything runs)."""
  for spec in o.workloads:
    parse_workload(spec)
  long_new_tokens = parse_workload(o.long, "--long")[3]
  try:
    settings.attended_lengths(long_new_tokens, o.long_block)
  except ValueError as e:
    raise ValueError(f"--long_block={o.long_block}: {e}") from None
  if not o.skew_n or any(n < 1 or o.skew_rows % n for n in o.skew_n):
    raise ValueError(f"--skew_n={','.join(map(str, o.skew_n))}: expected positive divisors "
                     f"of --skew_rows={o.skew_rows}")
  if not o.roofline:
    raise ValueError("--roofline=: expected at least one workload GxNxPxT")
  for spec in o.roofline:
    if parse_workload(spec, "--roofline entry")[3] < 2:
      raise ValueError(f"--roofline entry {spec!r}: expected T >= 2 (the step time is the "
                       "difference of calls with T and 1 new tokens)")
  if not o.sections or set(o.sections) - set(SECTIONS):
    raise ValueError(f"--sections={','.join(o.sections)}: expected a non-empty list of "
                     f"{', '.join(SECTIONS)}")
  if o.roofline_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"--roofline_dtype={o.roofline_dtype!r}: expected float32 or bfloat16")
  if o.bandwidth_bytes < 4:
    raise ValueError(f"--bandwidth_bytes={o.bandwidth_bytes}: expected at least 4")


_HELP = {"": "Model size (the Qwen2Config field of that meaning).",
         "workloads": "Sampling workloads GxNxPxT: prompts x rollouts per prompt x prompt "
                      "tokens x new tokens.",
         "share": "Shared prompt cache: values of n, total rollouts, P and T.",
         "skew": "Length skew: rows, rollouts per prompt (a list; G = rows / n), P, T, "
                 "fraction of prompts run to T, candidate prompts, continuous-batching "
                 "slots, the fewest they halve down to (0: no halving).",
         "long": "Long outputs: workload GxNxPxT and the decode_block of the blocked run.",
         "update": "Update step: sequences, tokens per sequence, prompt tokens of them.",
         "matmul": "Side of the float32 matmul that measures the FLOP/s peak.",
         "rl": "Steps of configs/hard.py whose phases are timed (the first is left out; "
               "0: skip).",
         "roofline": "Decode roofline: workloads GxNxPxT (T >= 2) and the dtype of weights, "
                     "activations and cache (float32 | bfloat16).",
         "bandwidth": "Bytes of the float32 array whose jitted x * 2 measures the copy "
                      "bandwidth.",
         "sections": f"Sections to run, of {','.join(SECTIONS)}.",
         "repeats": "Timed rounds per comparison (each side called once per round; "
                    "medians are reported).", "seed": "Seed."}


def _define_flags() -> None:
  """The binary's flags, defined only when it runs (tests import the functions beside
  other launch modules that define --out too)."""
  for f in dataclasses.fields(Options):
    help_ = next((h for k, h in _HELP.items() if k and f.name.startswith(k)), _HELP[""])
    if isinstance(f.default, tuple):
      flags.DEFINE_list(f.name, [str(x) for x in f.default], help_)
    elif isinstance(f.default, float):
      flags.DEFINE_float(f.name, f.default, help_)
    elif isinstance(f.default, str):
      flags.DEFINE_string(f.name, f.default, help_)
    else:
      flags.DEFINE_integer(f.name, f.default, help_)
  flags.DEFINE_string("out", None, "Where to write the figures as JSON.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  options = options_from_flags()
  try:
    check_options(options)   # fail before building anything
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  results = run(options)
  print(format_table(results))
  out = flags.FLAGS.out
  if out:
    storage.write_json(out, results)
    print(f"wrote {out}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
