"""LoRA's sampling: the adapted model (two small products beside each projection in
every decode step) against the same weights merged into plain projections (W + A @ B *
alpha / rank), on one G x n x P x T workload; and whether the two draw the same tokens
(greedy). `sampler.sample` merges (`SampleSpec.merge_adapters`) because the merged side
is the faster one."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from isojax.bench.ours import isojax_sample
from isojax.bench.options import Options
from isojax.bench.timing import parse_workload, random_prompts, rate, round_ratio, timed_rounds
from isojax.models import hf_checkpoint, lora
from isojax.models.settings import LORA_TARGETS


def adapted_and_merged(path: str, rank: int):
  """(adapted, merged) split models of the checkpoint at `path`, with rank-`rank`
  adapters on every projection whose B is drawn at random (B = 0 would be the base)."""
  model = hf_checkpoint.load_model(path, lora=dict(rank=rank, alpha=2.0 * rank,
                                                   targets=LORA_TARGETS, dropout=0.0))
  adapters, _ = lora.split(nnx.state(model))
  flat = [(path, var.replace(0.02 * jax.random.normal(jax.random.key(i), var.shape))
           if path[-1] == "b" else var)
          for i, (path, var) in enumerate(nnx.to_flat_state(adapters))]
  nnx.update(model, nnx.from_flat_state(flat))
  return nnx.split(model), nnx.split(lora.merged_model(model))


def bench_lora_sampling(models, o: Options, rng) -> dict:
  """Tokens/s of the adapted and the merged model (`adapted_and_merged`), interleaved
  (`timed_rounds`)."""
  g, n, p, t = parse_workload(o.lora_workload, "--lora_workload")
  adapted, merged = models
  prompts = random_prompts(rng, g, p, o.vocab)
  sample = lambda model, temperature, merge: isojax_sample(
      model, prompts, n=n, new_tokens=t, temperature=temperature, merge_adapters=merge)
  # The adapted side keeps its adapters in the decode step (the sampler would merge them).
  adapted_t, merged_t = timed_rounds([lambda: sample(adapted, 1.0, False),
                                      lambda: sample(merged, 1.0, True)], o.repeats)
  greedy = [np.asarray(sample(model, 0.0, merge).tokens)
            for model, merge in ((adapted, False), (merged, True))]
  ours, theirs = (rate(int(x.out.mask.sum()), x) for x in (adapted_t, merged_t))
  return dict(workload=o.lora_workload, rank=o.lora_rank, adapted=ours, merged=theirs,
              ratio=round_ratio(adapted_t, merged_t, ours["tokens"] / theirs["tokens"]),
              greedy_tokens_equal=float(np.mean(greedy[0] == greedy[1])))
