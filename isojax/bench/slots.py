"""Lockstep decoding against continuous batching on a run config's own model and problems.

`launch.bench --sections=slots --slots_config=FILE[:ARG]` builds what a run of that
config samples with (`run_inputs.check_inputs`: the policy, tokenizer, task, verifier and
the memory plan's sampler calls) and times, at each `decode_slots:decode_slots_min` level
of --slots_levels (0:0 is lockstep), the calls a run makes:
  - an evaluation chunk: the first `eval.chunk_problems` validation problems x
    `eval.num_samples` samples (`evaluation.correct_counts`, as an evaluation calls it);
  - a step's sampling at each n of --slots_n: the first `problems_per_batch` training
    problems x n.
Lockstep decoding runs a call until its longest reply ends; continuous batching refills
finished rows, so the gain grows with the spread of reply lengths. The levels draw
differently, so their replies differ by sampling noise; each level's mean and longest
reply length and its fraction cut at `sampling.max_new_tokens` come with its time.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
from flax import nnx

from isojax import configs
from isojax.config import config_lib
from isojax.models import hf_checkpoint
from isojax.run import evaluation, run_inputs
from isojax.bench.timing import round_ratio, timed_rounds


def _counts_summary(counts: evaluation.SampleCounts) -> dict:
  return dict(correct=int(counts.correct_G.sum()),
              mean_len=float(counts.lengths_GN.mean()), max_len=int(counts.lengths_GN.max()),
              truncated=float(counts.truncated_GN.mean()))


def compare(config_spec: str, levels: Sequence[tuple[int, int]], train_n: Sequence[int], *,
            repeats: int, seed: int) -> dict:
  """Each call's seconds (first call, median of `repeats` interleaved rounds) and the last
  round's replies per level, and each level's speedup over the first (the median of the
  per-round ratios)."""
  inputs = run_inputs.check_inputs(config_lib.as_settings(configs.load(config_spec)))
  s = inputs.settings
  graphdef, params = nnx.split(hf_checkpoint.load_model(inputs.path, inputs.mesh,
                                                        **s.model.as_kwargs()))
  rng = jax.random.key(seed)
  calls = [(f"evaluation chunk: {s.eval.chunk_problems} validation problems x "
            f"{s.eval.num_samples}", inputs.val_problems[:s.eval.chunk_problems],
            s.eval.num_samples, s.eval.chunk_problems)]
  calls += [(f"step sampling: {s.problems_per_batch} training problems x {n}",
             inputs.train_problems[:s.problems_per_batch], n, s.problems_per_batch)
            for n in train_n]

  def sampler(problems, n, chunk, level):
    sampling = dataclasses.replace(s.sampling, decode_slots=level[0],
                                   decode_slots_min=level[1])
    # A fresh key each call (the warm-up's, then one per round), the same sequence at
    # every level: a small call's time follows its longest reply, so one draw would
    # time that draw, not the schedule.
    keys = iter(range(1 + max(repeats, 1)))
    return lambda: evaluation.correct_counts(
        graphdef, params, inputs.tok, inputs.book, problems, inputs.verifier,
        num_samples=n, chunk=chunk, rng=jax.random.fold_in(rng, next(keys)),
        sampling=sampling)

  rows = []
  for name, problems, n, chunk in calls:
    timings = timed_rounds([sampler(problems, n, chunk, level) for level in levels], repeats)
    rows.append(dict(call=name, rollouts=chunk * n, levels=[
        dict(slots=level[0], min_slots=level[1], first_s=t.first_s, median_s=t.median_s,
             speedup=round_ratio(t, timings[0]), **_counts_summary(t.out))
        for level, t in zip(levels, timings)]))
  return dict(config=config_spec, model=inputs.path, max_new_tokens=s.sampling.max_new_tokens,
              temperature=s.sampling.temperature, repeats=repeats, calls=rows)
