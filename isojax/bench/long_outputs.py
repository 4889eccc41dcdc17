"""Long outputs: attention over the whole generated cache against blocked attention
over its filled part (`sampling.decode_block`)."""

from __future__ import annotations

import numpy as np

from isojax.bench.ours import isojax_sample
from isojax.bench.options import Options
from isojax.bench.timing import parse_workload, random_prompts, rate, round_ratio, timed_rounds


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

