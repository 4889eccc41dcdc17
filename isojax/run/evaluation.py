"""Validation: avg@k, best@k and worst@k from N >= k samples per held-out problem.

Evaluation uses the same sampler and verifier as training and a fixed random key, so
two evaluations of the same policy are identical and evaluations of different
policies share their sampling noise (common random numbers make step-to-step
differences less noisy). Problems are processed in fixed-size chunks, the last one
padded by repetition, so one compiled sampler serves every evaluation.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Sequence

import jax
import numpy as np

from isojax import eval_settings, metrics
from isojax.models.tokenizer import TextTokenizer
from isojax.rl import rollout
from isojax.sampling import settings as sampling_settings
from isojax.tasks import Problem, Verifier
from isojax.tasks.prompts import PromptBook


class SampleCounts(NamedTuple):
  """What `correct_counts` measured of G problems' N samples each."""
  correct_G: np.ndarray     # [G] int, correct samples of N
  lengths_GN: np.ndarray    # [G, N] int, generated tokens (stop token included)
  truncated_GN: np.ndarray  # [G, N] bool, cut at max_new_tokens (no stop token)


def correct_counts(graphdef, params, tok: TextTokenizer, book: PromptBook,
                   problems: Sequence[Problem], verifier: Verifier, *, num_samples: int,
                   chunk: int, rng: jax.Array,
                   sampling: sampling_settings.SamplingSettings,
                   done: Mapping[int, SampleCounts] | None = None,
                   on_chunk: Callable[[int, SampleCounts], None] | None = None
                   ) -> SampleCounts:
  """Correct samples out of `num_samples` per problem, and every sample's length and
  whether it was truncated at `max_new_tokens`.

  Each chunk of `chunk` problems is sampled with its own key (`rng` folded with the
  index of its first problem), so chunks are independent of each other: `done` holds
  chunks already measured, by that index, which are taken as they are, and
  `on_chunk(start, counts)` is told of each chunk measured here. A long measurement
  (`isojax.sweeps.profiling`'s) that records them resumes where it stopped and ends
  equal to an uninterrupted one.
  """
  done = done or {}
  parts = []
  for start in range(0, len(problems), chunk):
    part = list(problems[start:start + chunk])
    real = len(part)
    if start in done:
      parts.append(done[start])
      continue
    part += [part[-1]] * (chunk - real)  # keep the compiled shape
    scored = rollout.generate(graphdef, params, tok, book, part, verifier, n=num_samples,
                              rng=jax.random.fold_in(rng, start), sampling=sampling)
    rows = real * num_samples
    counts = SampleCounts(
        (scored.rewards_GN[:real] > 0.5).sum(axis=1),
        np.asarray(scored.rollouts.lengths)[:rows].reshape(real, num_samples),
        ~np.asarray(scored.rollouts.finished)[:rows].reshape(real, num_samples))
    if on_chunk is not None:
      on_chunk(start, counts)
    parts.append(counts)
  return SampleCounts(*(np.concatenate(field) for field in zip(*parts)))


def evaluate(graphdef, params, tok: TextTokenizer, book: PromptBook,
             problems: Sequence[Problem], verifier: Verifier,
             settings: eval_settings.EvalSettings,
             sampling: sampling_settings.SamplingSettings, *, rng: jax.Array,
             histogram_problems: Sequence[Problem] = ()) -> dict[str, float | list[int]]:
  """avg@k, best@k, worst@k (with standard errors) and the truncated fraction on
  `problems`, plus the pass@1 histogram of `histogram_problems` if there are any.

  The per-problem correct counts behind them (`metrics.VAL_CORRECT_COUNTS`, and
  `metrics.TRAIN_PASS1_COUNTS` with the histogram) come along as lists of ints in the
  problems' order, so an analysis can bootstrap confidence intervals over problems.

  The histogram (training problems with 0..N of N samples correct) is the IsoCompute
  paper's interference diagnostic: with small n a few problems get solved (pass@1 -> 1)
  while others fall to 0, and its mass moving to both ends shows it.
  """
  num_samples = settings.num_samples

  def count(part: Sequence[Problem]) -> SampleCounts:
    return correct_counts(graphdef, params, tok, book, part, verifier, num_samples=num_samples,
                          chunk=min(settings.chunk_problems, len(part)), rng=rng,
                          sampling=sampling)

  val = count(problems)
  counts_G = val.correct_G
  result = dict(metrics.summarize_correct(counts_G, num_samples, settings.k),
                **{metrics.VAL_TRUNCATED: float(val.truncated_GN.mean()),
                   metrics.VAL_CORRECT_COUNTS: counts_G.tolist()})
  if histogram_problems:
    counts_G = count(histogram_problems).correct_G
    result[metrics.TRAIN_PASS1_HISTOGRAM] = metrics.pass_count_histogram(counts_G, num_samples)
    result[metrics.TRAIN_PASS1_COUNTS] = counts_G.tolist()
  return result
