"""Timing helpers of the benchmarks: interleaved rounds, per-round ratios, workloads."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np


def parse_workload(spec: str, flag: str = "--workloads entry") -> tuple[int, int, int, int]:
  """'32x8x64x64' -> (G, n, P, T)."""
  parts = spec.split("x")
  if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"{flag} {spec!r}: expected GxNxPxT of positive integers "
                     "(prompts x rollouts per prompt x prompt tokens x new tokens)")
  return tuple(int(p) for p in parts)


def parse_levels(spec: Sequence[str], flag: str = "--slots_levels") -> tuple[tuple[int, int], ...]:
  """['0:0', '64:8'] -> ((0, 0), (64, 8)): decode_slots:decode_slots_min pairs."""
  levels = []
  for entry in spec:
    slots, sep, min_slots = entry.partition(":")
    if not (sep and slots.isdigit() and min_slots.isdigit()):
      raise ValueError(f"{flag} entry {entry!r}: expected SLOTS:MIN of non-negative "
                       "integers (0:0 is lockstep decoding)")
    if int(min_slots) and not int(slots):
      raise ValueError(f"{flag} entry {entry!r}: a minimum needs slots (lockstep is 0:0)")
    levels.append((int(slots), int(min_slots)))
  if not levels:
    raise ValueError(f"{flag}=: expected at least one SLOTS:MIN level")
  return tuple(levels)


def random_prompts(rng: np.random.Generator, g: int, p: int, vocab: int) -> np.ndarray:
  return rng.integers(1, vocab, size=(g, p)).astype(np.int32)   # [G, P], no padding


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


def rate(tokens: int, t: Timing) -> dict:
  return dict(tokens=tokens, median_s=t.median_s, tokens_per_s=tokens / t.median_s,
              compile_s=max(t.first_s - t.median_s, 0.0), times_s=t.times_s)

