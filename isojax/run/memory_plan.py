"""How big each pass of a step may be: micro-batches, LM-head chunks, sampler calls.

A real checkpoint's vocabulary makes the naive step enormous: the logits of 256
rollouts of 400 tokens over SmolLM2's 49,152 ids are 20 GB in float32, and the
decode cache of 2,048 evaluation rollouts of a 30-layer model is tens of GB. When
`rl.micro_batch_size`, `rl.logprob_chunk_size` or `sampling.max_rollouts_per_call`
is 0 (the default), `plan` derives it from the model's shape, the batch and the
memory there is (host RAM on CPU, the device's memory on an accelerator): the
largest micro-batch and sampler call whose estimate fits, with the LM head chunked
so that no pass holds [B, T, V] logits beyond `LOGIT_BYTES` (more on an accelerator,
where fewer chunks are faster). Small models keep one pass and one call, so their
programs do not change. A value set by hand is kept; a run whose estimate exceeds
the memory there is refused before anything is written, with the values that would
fit. Off-policy generation on the learner's devices (`rl.max_staleness` > 0) samples
the next batches from copies of the weights while the update or an evaluation runs:
its copies and its call count beside them. A sampler that casts the weights to
bfloat16 (a bfloat16 model's default) holds that copy beside its caches; the
generator's copies are kept in that dtype already.

What each pass holds is `memory_estimates`' (an upper bound on XLA's own accounting of
the same programs, not a measurement). Pure Python: no JAX import, so the planner and
the config layer can use it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from isojax.config import run_settings
from isojax.run.memory_estimates import (Shape, lora_params, resident_bytes, sample_bytes,
                                         score_bytes, update_bytes)

GIB = 1024 ** 3
# The LM head's share of a pass: logits (and their softmax and gradient) of one
# chunk of response positions, at most this many bytes. Each chunk also adds the
# float32 head gradient once (0.93 GB at Qwen2.5-1.5B's 151,936 x 1,536), so an
# accelerator takes fewer, larger chunks: at 32 rollouts a pass, chunks of 128
# positions (7.5 GB by this count) against 16 took a 1.5B update on one H100 from
# 2.63 to 2.35 s (docs/results/gpu_update.md).
LOGIT_BYTES = {"cpu": 256 * 1024 ** 2, "accelerator": 8 * 1024 ** 3}
# Of the memory there is, the share a step plans to use. An accelerator's memory is
# the step's own (the rest: XLA's reserves, fragmentation); host RAM is shared with
# the Python process, the data, the verifier pool and whatever else runs, and on a
# CPU a pass is compute-bound long before it is large, so bigger passes buy nothing.
USABLE_FRACTION = {"cpu": 0.3, "accelerator": 0.8}
_CHUNK_ALIGN = 16  # LM-head chunks are multiples of this many positions
@dataclasses.dataclass(frozen=True)
class Passes:
  """The sizes of a step's passes: 0 means one pass over everything (no split)."""
  micro_batch_size: int
  logprob_chunk_size: int
  max_rollouts_per_call: int


def available_bytes() -> tuple[int, str]:
  """(bytes a step may use, "cpu" or "accelerator"): the first device's limit on an
  accelerator, else the host's physical RAM. A property of the machine, not of the
  moment, so a resumed run plans the passes it planned before (a sampler call's size
  decides its draws)."""
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  if device.platform != "cpu":
    stats = device.memory_stats() or {}
    if stats.get("bytes_limit"):
      return int(stats["bytes_limit"]), "accelerator"
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "cpu"


def _divisors_descending(total: int, multiple_of: int = 1) -> list[int]:
  return [d for d in range(total, 0, -1) if total % d == 0 and d % multiple_of == 0]


def _chunk_for(shape: Shape, rows: int, response: int, limit: int = LOGIT_BYTES["cpu"]) -> int:
  """The LM-head chunk for `rows`: all positions when their logits fit `limit` bytes,
  else the fewest chunks that fit, of equal size (the last one padded to a multiple
  of _CHUNK_ALIGN, so little of it is padding)."""
  per_position = rows * shape.vocab_size * 4 * 3
  if per_position * response <= limit:
    return 0
  fits = max(_CHUNK_ALIGN, limit // per_position // _CHUNK_ALIGN * _CHUNK_ALIGN)
  chunks = -(-response // fits)
  return min(fits, -(-response // chunks // _CHUNK_ALIGN) * _CHUNK_ALIGN) if chunks > 1 \
      else fits


@dataclasses.dataclass(frozen=True)
class Step:
  """What one RL step runs: its batch and sequence lengths."""
  rollouts: int           # B_p * n sampled per step
  minibatch: int          # rollouts per optimizer update (B_p * m / num_minibatches)
  group: int              # the largest group a sampler call holds whole (n, eval samples)
  sample_rollouts: int    # the largest sampler call unsplit: a step's, or an evaluation's
  prompt_len: int
  max_new_tokens: int
  trained_params: int     # parameters the optimizer updates (LoRA: the adapters)
  reference: bool         # a second copy of the weights for the KL / its log
  # Off-policy generation on the learner's devices (rl.max_staleness > 0, no devices of
  # its own) samples the next batches beside the update and the evaluation, from copies
  # of the weights: this many of them live at once (0: generation is not overlapped).
  generator_copies: int = 0
  # A sampler call's cast of the weights (`RunSettings.sampler_weights_dtype`: bfloat16
  # under a bfloat16 model), held beside its caches: 2 bytes a parameter, or 0.
  sample_weight_bytes: int = 0
  # Bytes a parameter of each generator copy: 4 (float32, cast by each of its sampler
  # calls when `sample_weight_bytes`), or 2 (cast once per version: its calls cast none).
  generator_param_bytes: int = 4


@dataclasses.dataclass(frozen=True)
class Plan:
  passes: Passes
  resident: int
  update: int
  score: int
  sample: int
  budget: int
  available: int
  generator: int = 0   # overlapped: the weights' copies and a training batch's sampler call

  @property
  def peak(self) -> int:
    return self.resident + self.generator + max(self.update, self.score, self.sample)

  def describe(self) -> str:
    p = self.passes
    return (f"micro-batches of {p.micro_batch_size or 'the whole minibatch'}, LM head over "
            f"{p.logprob_chunk_size or 'all'} positions at a time, sampler calls of "
            f"{p.max_rollouts_per_call or 'every'} rollouts; estimated peak "
            f"{self.peak / GIB:.2f} GiB (weights and optimizer {self.resident / GIB:.2f}, "
            f"update {self.update / GIB:.2f}, scoring {self.score / GIB:.2f}, sampling "
            f"{self.sample / GIB:.2f}"
            + (f", beside them the generator {self.generator / GIB:.2f}" if self.generator
               else "") + f") of {self.available / GIB:.1f} GiB available")


def plan(shape: Shape, step: Step, requested: Passes, available: int,
         fraction: float = USABLE_FRACTION["cpu"], logits: int = LOGIT_BYTES["cpu"]) -> Plan:
  """The passes of `step`: `requested` where set (non-zero), derived where 0, within
  `fraction` of the `available` bytes, the LM head's chunks within `logits` bytes."""
  resident = resident_bytes(shape, trained_params=step.trained_params, reference=step.reference)
  budget = int(available * fraction) - resident
  weights = step.generator_param_bytes * shape.params * step.generator_copies
  seq, response = step.prompt_len + step.max_new_tokens, step.max_new_tokens

  def score_rows(rows):  # micro-batches of the update's size, or every rollout at once
    return rows if rows < step.minibatch else step.rollouts

  def update_cost(rows, chunk):
    return max(update_bytes(shape, rows, seq, response, chunk),
               score_bytes(shape, score_rows(rows), seq, response, chunk))

  per_rollout = max(sample_bytes(shape, 1, step.prompt_len, step.max_new_tokens), 1)
  cast = step.sample_weight_bytes
  # The generator's own calls cast float32 copies; copies kept in the sampler's dtype need
  # no cast.
  generator_cast = cast if step.generator_copies and step.generator_param_bytes == 4 else 0
  micro, chunk = requested.micro_batch_size, requested.logprob_chunk_size
  if not micro:
    # Divides both the minibatch (the update) and the step's rollouts (scoring).
    candidates = [d for d in _divisors_descending(step.minibatch) if step.rollouts % d == 0]

    def largest_fitting(limit):
      cost = lambda r: update_cost(r, chunk or _chunk_for(shape, r, response))
      return next((r for r in candidates if cost(r) <= limit), None)

    rows = None
    if step.generator_copies and not requested.max_rollouts_per_call:
      # Overlapped: a smaller micro-batch that leaves room for a whole training batch's
      # sampler call beside it, rather than the generator sampling in small calls.
      rows = largest_fitting(budget - weights - generator_cast - step.rollouts * per_rollout)
    if rows is None:
      rows = largest_fitting(budget - weights - generator_cast) or candidates[-1]
    micro = 0 if rows >= step.minibatch else rows
  rows = micro or step.minibatch

  def calls_for(chunk):  # the sampler calls beside an update of `rows` with this chunk
    if requested.max_rollouts_per_call:
      return requested.max_rollouts_per_call
    if step.generator_copies:
      fits = _overlapped_calls(budget - weights - cast - generator_cast,
                               update_cost(rows, chunk), per_rollout, step.rollouts)
    else:
      fits = max(budget - cast, 0) // per_rollout
    return 0 if fits >= step.sample_rollouts else max(step.group, fits)

  if not chunk:
    # The micro-batch first, then the largest chunk within `logits` that fits beside it
    # and leaves the sampler calls the smallest chunks leave (0: one call, the most).
    least = LOGIT_BYTES["cpu"]
    chunk = _chunk_for(shape, rows, response, least)
    most_calls, limit = calls_for(chunk) or step.sample_rollouts, logits
    while limit > least:
      bigger = _chunk_for(shape, rows, response, limit)
      if (update_cost(rows, bigger) <= budget - weights - generator_cast
          and (calls_for(bigger) or step.sample_rollouts) >= most_calls):
        chunk = bigger
        break
      limit //= 2
  calls = calls_for(chunk)
  sample_rows = min(calls or step.sample_rollouts, step.sample_rollouts)
  generator = (weights + generator_cast
               + sample_bytes(shape, min(calls or step.rollouts, step.rollouts),
                              step.prompt_len, step.max_new_tokens)
               if step.generator_copies else 0)
  return Plan(passes=Passes(micro, chunk, calls), resident=resident,
              update=update_bytes(shape, rows, seq, response, chunk),
              score=score_bytes(shape, score_rows(rows), seq, response, chunk),
              sample=cast + sample_bytes(shape, sample_rows, step.prompt_len,
                                         step.max_new_tokens),
              budget=budget, available=available, generator=generator)


def _overlapped_calls(budget: int, update: int, per_rollout: int, rollouts: int) -> int:
  """The largest sampler call c (in rollouts) whose training call (min(c, rollouts))
  fits beside the update, or beside another call of c (an evaluation's): min(c, R) p +
  max(U, c p) <= budget."""
  within = min((budget - update) // per_rollout, budget // (2 * per_rollout))
  if within < rollouts:
    return max(within, 0)
  # A whole training batch fits beside the update: evaluation calls may be larger.
  return max(rollouts, (budget - rollouts * per_rollout) // per_rollout)


def sampler_calls(shape: Shape, *, rollouts: int, group: int, prompt_len: int,
                  max_new_tokens: int, available: int | None = None,
                  kind: str = "cpu", cast_bytes: int = 0) -> int:
  """`sampling.max_rollouts_per_call` for a job that only samples (`launch.profile`):
  0 (one call) when `rollouts` fit beside the weights (and their cast for the sampler,
  `cast_bytes`: `sample_weight_bytes`), else the most that fit, at least a `group` (a
  problem's samples stay in one call). Raises when not one group fits."""
  if available is None:
    available, kind = available_bytes()
  weights = 4 * shape.params + cast_bytes
  budget = int(available * USABLE_FRACTION[kind]) - weights
  per_rollout = sample_bytes(shape, 1, prompt_len, max_new_tokens)
  fits = max(budget, 0) // max(per_rollout, 1)
  if fits >= rollouts:
    return 0
  if fits < group:
    raise ValueError(
        f"sampling {group} rollouts of one problem ({prompt_len} prompt + {max_new_tokens} "
        f"new tokens) needs an estimated {(weights + group * per_rollout) / GIB:.2f}"
        f" GiB, above the {available / GIB:.1f} GiB this machine has; expected fewer "
        f"samples per problem or a lower sampling.max_new_tokens={max_new_tokens}")
  return fits


_FIELDS = {"micro_batch_size": "rl.micro_batch_size",
           "logprob_chunk_size": "rl.logprob_chunk_size",
           "max_rollouts_per_call": "sampling.max_rollouts_per_call"}


def for_settings(config: run_settings.RunSettings, model_cfg: Any, *, prompt_len: int,
                 available: int | None = None, kind: str = "cpu") -> Plan:
  """The plan of a run's settings on the model `model_cfg` (a ModelConfig). The facts
  derived from several fields (m, LoRA, a kept reference) are the settings' own.

  Raises, naming the fields and the values that would fit, when the estimate of the
  passes (as set, or at their smallest) exceeds the memory there is.
  """
  if available is None:
    available, kind = available_bytes()
  n, b_p = config.rollouts_per_problem, config.problems_per_batch
  m = config.train_rollouts_per_problem
  eval_call = config.eval.chunk_problems * config.eval.num_samples
  lora = config.model.lora.enabled
  shape = Shape.of(model_cfg)
  trained = shape.params
  if lora:  # adapters: rank x (in + out) per target projection per layer
    trained = lora_params(model_cfg)
  step = Step(rollouts=b_p * n, minibatch=b_p * m // config.rl.num_minibatches,
              group=max(n, config.eval.num_samples),
              sample_rollouts=max(b_p * n, eval_call), prompt_len=prompt_len,
              max_new_tokens=config.sampling.max_new_tokens, trained_params=trained,
              reference=config.rl.keeps_reference and not lora,  # LoRA's is the base
              generator_copies=generator_copies(config),
              sample_weight_bytes=sample_weight_bytes(config, shape),
              generator_param_bytes=2 if config.generator_weights_dtype else 4)
  requested = Passes(config.rl.micro_batch_size, config.rl.logprob_chunk_size,
                     config.sampling.max_rollouts_per_call)
  result = plan(shape, step, requested, available, USABLE_FRACTION[kind], LOGIT_BYTES[kind])
  if result.peak > available:
    smallest = plan(shape, step, Passes(0, 0, 0), 0, USABLE_FRACTION[kind])
    set_by_hand = [f"{_FIELDS[k]}={v}" for k, v in dataclasses.asdict(requested).items() if v]
    raise ValueError(
        f"the run's estimated peak memory is {result.peak / GIB:.2f} GiB, above the "
        f"{available / GIB:.1f} GiB this machine has ({result.describe()})"
        + (f"; set by hand: {', '.join(set_by_hand)}" if set_by_hand else "")
        + "; expected an estimate that fits: "
        + ("leave those fields at 0 to derive them, or " if set_by_hand else "")
        + f"lower problems_per_batch={b_p}, rollouts_per_problem={n}, "
        f"sampling.max_new_tokens={config.sampling.max_new_tokens} or "
        f"eval.chunk_problems={config.eval.chunk_problems}, or set model.remat='full'"
        + (f", or lower rl.max_staleness={config.rl.max_staleness} (its generator holds "
           f"{step.generator_copies} copies of the weights beside the update) or give the "
           "generator devices of its own (mesh.rollout_fraction)"
           if step.generator_copies else "")
        + f" (at the smallest passes the estimate is {smallest.peak / GIB:.2f} GiB)")
  return result


def generator_copies(config: run_settings.RunSettings) -> int:
  """Copies of the weights off-policy generation holds beside the learner's: none when
  it is synchronous or has devices of its own (`mesh.rollout_fraction`); else one per
  version queued (up to k) and the one being sampled from (`rl.off_policy.Generator`),
  or, in flight, the newest published and the one a rollout still reads."""
  k = config.rl.max_staleness
  if not k or config.mesh.rollout_fraction:
    return 0
  return 2 if config.rl.off_policy == "pipeline_in_flight" else k + 1


def sample_weight_bytes(config: run_settings.RunSettings, shape: Shape) -> int:
  """Bytes of a sampler call's bfloat16 cast of the weights (0: it reads them as stored)."""
  return 2 * shape.params if config.sampler_weights_dtype == "bfloat16" else 0
