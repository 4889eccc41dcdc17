"""Validation: avg@k, best@k and worst@k from N >= k samples per held-out problem.

Evaluation uses the same sampler and verifier as training and a fixed random key, so
two evaluations of the same policy are identical and evaluations of different
policies share their sampling noise (common random numbers make step-to-step
differences less noisy). Problems are processed in fixed-size chunks, the last one
padded by repetition, so one compiled sampler serves every evaluation.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import ml_collections
import numpy as np

from isojax import metrics
from isojax.models.tokenizer import TextTokenizer
from isojax.rl import rollout


def correct_counts(graphdef, params, tok: TextTokenizer, problems: Sequence,
                   reward_fn: Callable, *, num_samples: int, chunk: int, rng: jax.Array,
                   prompt_len: int, sampling: ml_collections.ConfigDict) -> np.ndarray:
  """Number of correct samples out of `num_samples` for each problem, [P] int."""
  counts = []
  for start in range(0, len(problems), chunk):
    part = list(problems[start:start + chunk])
    real = len(part)
    part += [part[-1]] * (chunk - real)  # keep the compiled shape
    scored = rollout.generate(graphdef, params, tok, part, reward_fn, n=num_samples,
                              rng=jax.random.fold_in(rng, start), prompt_len=prompt_len,
                              sampling=sampling)
    counts.append((scored.rewards_GN[:real] > 0.5).sum(axis=1))
  return np.concatenate(counts)


def evaluate(graphdef, params, tok: TextTokenizer, problems: Sequence, reward_fn: Callable,
             config: ml_collections.ConfigDict, *, rng: jax.Array, prompt_len: int,
             ) -> dict[str, float]:
  counts = correct_counts(graphdef, params, tok, problems, reward_fn,
                          num_samples=config.eval.num_samples,
                          chunk=min(config.eval.chunk_problems, len(problems)), rng=rng,
                          prompt_len=prompt_len, sampling=config.sampling)
  return metrics.summarize_correct(counts, config.eval.num_samples, config.eval.k)


def pass_rate_histogram(graphdef, params, tok: TextTokenizer, problems: Sequence,
                        reward_fn: Callable, config: ml_collections.ConfigDict, *,
                        rng: jax.Array, prompt_len: int) -> list[int]:
  """Training problems with 0..N of N samples correct: the interference diagnostic.

  With small n a few problems get solved (pass@1 -> 1) while others fall to 0; the
  histogram's mass moving to both ends shows it (PLAYBOOK section 1, point 5).
  """
  counts = correct_counts(graphdef, params, tok, problems, reward_fn,
                          num_samples=config.eval.num_samples,
                          chunk=min(config.eval.chunk_problems, len(problems)), rng=rng,
                          prompt_len=prompt_len, sampling=config.sampling)
  return metrics.pass_count_histogram(counts, config.eval.num_samples)
