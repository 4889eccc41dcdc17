"""Validation: avg@k, best@k and worst@k from N >= k samples per held-out problem.

Evaluation uses the same sampler and verifier as training and a fixed random key, so
two evaluations of the same policy are identical and evaluations of different
policies share their sampling noise (common random numbers make step-to-step
differences less noisy). Problems are processed in fixed-size chunks, the last one
padded by repetition, so one compiled sampler serves every evaluation.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from isojax import eval_settings, metrics
from isojax.models.tokenizer import TextTokenizer
from isojax.rl import rollout
from isojax.sampling import settings as sampling_settings
from isojax.tasks import Problem, Verifier
from isojax.tasks.prompts import PromptBook


def correct_counts(graphdef, params, tok: TextTokenizer, book: PromptBook,
                   problems: Sequence[Problem], verifier: Verifier, *, num_samples: int,
                   chunk: int, rng: jax.Array,
                   sampling: sampling_settings.SamplingSettings
                   ) -> tuple[np.ndarray, float]:
  """Correct samples out of `num_samples` per problem [G] int, and the fraction of
  samples truncated at `max_new_tokens`."""
  counts, truncated = [], []
  for start in range(0, len(problems), chunk):
    part = list(problems[start:start + chunk])
    real = len(part)
    part += [part[-1]] * (chunk - real)  # keep the compiled shape
    scored = rollout.generate(graphdef, params, tok, book, part, verifier, n=num_samples,
                              rng=jax.random.fold_in(rng, start), sampling=sampling)
    counts.append((scored.rewards_GN[:real] > 0.5).sum(axis=1))
    truncated.append(~np.asarray(scored.rollouts.finished)[:real * num_samples])
  return np.concatenate(counts), float(np.concatenate(truncated).mean())


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

  def count(part: Sequence[Problem]) -> tuple[np.ndarray, float]:
    return correct_counts(graphdef, params, tok, book, part, verifier, num_samples=num_samples,
                          chunk=min(settings.chunk_problems, len(part)), rng=rng,
                          sampling=sampling)

  counts_G, truncated = count(problems)
  result = dict(metrics.summarize_correct(counts_G, num_samples, settings.k),
                **{metrics.VAL_TRUNCATED: truncated,
                   metrics.VAL_CORRECT_COUNTS: counts_G.tolist()})
  if histogram_problems:
    counts_G, _ = count(histogram_problems)
    result[metrics.TRAIN_PASS1_HISTOGRAM] = metrics.pass_count_histogram(counts_G, num_samples)
    result[metrics.TRAIN_PASS1_COUNTS] = counts_G.tolist()
  return result
