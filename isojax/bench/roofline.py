"""Decode against the memory-bandwidth roofline, one section of `launch.bench`.

At small batch a decode step is memory-bound: it reads every weight once and every
row's KV cache, and does little arithmetic per byte. Its roofline is then the device's
memory bandwidth, and the figure of merit is

    achieved bandwidth = bytes read per step / step time

against (a) the bandwidth a jitted elementwise pass over a large array reaches on the
same device (read + write, the STREAM "scale" kernel; measured here, so it exists on
every backend) and (b) the device's nominal HBM bandwidth where its `device_kind` is
in `datasheets.NOMINAL_BANDWIDTH` (datasheet figures; none for CPUs).

Bytes per step: the sampling weights at their dtype, except the embedding table, of
which a step reads one row per sequence (when the LM head is tied to it, the head reads
it whole and it is counted whole); plus the KV caches the step attends over: each
group's prompt cache (P positions, shared by its n rollouts, read once) and every
row's whole preallocated generated cache (T slots: without `decode_block` the sampler
attends over all of them and masks the unfilled ones). Activations, logits and the
sampling draw are left out; at small batch they are a small fraction.

Step time: calls with T new tokens and with 1 new token are interleaved in rounds,
and (time(T) - time(1)) / (T - 1) per round removes the prefill and the per-call
overhead; the median over rounds is reported.
"""

from __future__ import annotations

import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from isojax.bench import datasheets
from isojax.bench.ours import isojax_sample
from isojax.bench.options import Options
from isojax.bench.timing import parse_workload, random_prompts, timed_rounds



def decode_bytes(*, weight_bytes: int, embed_bytes: int, tied: bool, rows: int, groups: int,
                 hidden: int, layers: int, kv_heads: int, head_dim: int, prompt_len: int,
                 cache_len: int, cache_itemsize: int, weight_itemsize: int) -> dict:
  """Bytes one decode step reads: weights and KV caches (see the module docstring).

  `weight_bytes` is every parameter at the sampling dtype, `embed_bytes` the embedding
  table's share of it.
  """
  weights = weight_bytes if tied else weight_bytes - embed_bytes + rows * hidden * weight_itemsize
  per_position = layers * 2 * kv_heads * head_dim * cache_itemsize   # k and v, every layer
  prefix = groups * prompt_len * per_position
  generated = rows * cache_len * per_position
  return dict(weights=weights, prefix_cache=prefix, generated_cache=generated,
              total=weights + prefix + generated)


def fastest_rate(call: Callable[[], object], work: float, calls: int = 5) -> float:
  """`work` / seconds of the fastest of `calls` calls (each waited on): a peak rate."""
  seconds = []
  for _ in range(calls):
    start = time.perf_counter()
    jax.block_until_ready(call())
    seconds.append(time.perf_counter() - start)
  return work / min(seconds)


def copy_bandwidth(num_bytes: int, calls: int = 5) -> Callable[[], float]:
  """A callable returning the bytes/s of the fastest of `calls` jitted `x * 2` passes
  over a float32 array of `num_bytes` (each reads and writes it; the first compiles)."""
  x = jnp.ones((num_bytes // 4,), jnp.float32)
  scale = jax.jit(lambda x: x * 2)
  return lambda: fastest_rate(lambda: scale(x), 2 * x.nbytes, calls)


def step_seconds(long_s: list[float], short_s: list[float], new_tokens: int) -> float:
  """Median over rounds of (time of T new tokens - time of 1) / (T - 1)."""
  if new_tokens < 2:
    raise ValueError(f"--roofline new tokens T={new_tokens}: expected at least 2")
  return float(np.median((np.asarray(long_s) - np.asarray(short_s)) / (new_tokens - 1)))


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
  best = copy_bandwidth(o.bandwidth_bytes)
  peaks = []
  _, short, long = timed_rounds([lambda: peaks.append(best()), lambda: run(1), lambda: run(t)],
                                o.repeats)
  peaks = peaks[1:]   # the warm-up round's left out
  steps = [step_seconds([lt], [st], t)
           for lt, st in zip(long.times_s, short.times_s)]
  read = decode_bytes(
      weight_bytes=sum(counts.values()) * itemsize, embed_bytes=counts["embed"] * itemsize,
      tied=tied, rows=g * n, groups=g, hidden=o.hidden, layers=o.layers, kv_heads=o.kv_heads,
      head_dim=o.hidden // o.heads, prompt_len=p, cache_len=t, cache_itemsize=itemsize,
      weight_itemsize=itemsize)
  device_kind = jax.devices()[0].device_kind
  nominal = datasheets.nominal_bandwidth(device_kind)
  step_s = float(np.median(steps))
  achieved = read["total"] / step_s
  return dict(workload=workload, dtype=o.roofline_dtype, rows=g * n, bytes_per_step=read,
              step_s=step_s, steps_s=steps, bytes_per_s=achieved,
              copy_bytes_per_s=float(np.median(peaks)), copy_peaks=peaks,
              fraction_of_copy=float(np.median([read["total"] / sec / peak
                                                for sec, peak in zip(steps, peaks)])),
              device_kind=device_kind, nominal_bytes_per_s=nominal,
              fraction_of_nominal=None if nominal is None else achieved / nominal)

