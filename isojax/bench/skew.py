"""Length-skewed batches: lockstep decoding against continuous batching."""

from __future__ import annotations

import numpy as np

from isojax.bench.ours import isojax_prefill, isojax_sample
from isojax.bench.options import Options
from isojax.bench.timing import Timing, decode_ratio, random_prompts, rate, round_ratio, timed_rounds


def slot_waste(mask_BT: np.ndarray) -> dict:
  """Decode slots the static loop executes (every row until the longest stops) vs used."""
  lengths = np.asarray(mask_BT).sum(-1)
  executed = int(mask_BT.shape[0] * lengths.max())
  useful = int(lengths.sum())
  return dict(useful_slots=useful, executed_slots=executed,
              waste_fraction=1.0 - useful / executed)


def find_skew_prompts(tokens_AT: np.ndarray, short_len: int):
  """(short index, long index, stop id) among greedy continuations [A, T] of A candidate prompts.

  The short prompt's token at slot short_len - 1 is the stop id and absent before it;
  the long prompt's continuation never contains it.
  """
  for i, row in enumerate(tokens_AT):
    stop = int(row[short_len - 1])
    if stop in row[:short_len - 1]:
      continue
    for j, other in enumerate(tokens_AT):
      if j != i and stop not in other:
        return i, j, stop
  raise ValueError(f"no pair of the {len(tokens_AT)} candidate prompts gives a short and a "
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

