"""Sampling throughput against Hugging Face (and Tunix), and the shared prompt cache
at several n for the same number of rollouts."""

from __future__ import annotations

from isojax.bench import hf as hf_lib
from isojax.bench import tunix as tunix_lib
from isojax.bench.ours import isojax_sample
from isojax.bench.options import Options
from isojax.bench.timing import parse_workload, random_prompts, rate, round_ratio, timed_rounds


def bench_sampling(model, hf_model, spec: str, o: Options, rng, tunix=None) -> dict:
  """isojax vs HF (vs Tunix, given a `tunix_lib.load` handle) tokens/s on one
  G x n x P x T workload, the sides' calls interleaved (`timed_rounds`)."""
  g, n, p, t = parse_workload(spec)
  prompts = random_prompts(rng, g, p, o.vocab)
  fns = [lambda: isojax_sample(model, prompts, n=n, new_tokens=t),
         lambda: hf_lib.hf_sample(hf_model, prompts, n=n, new_tokens=t)]
  if tunix is not None:
    fns.append(lambda: tunix_lib.sample(tunix, prompts, n, t))
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

