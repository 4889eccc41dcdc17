"""From problems to scored rollouts: prompt batches, sampling, verification.

Shared by the training loop, evaluation and profiling, so all see exactly the same
prompts, sampling settings, stop tokens and verifier. `sample` returns as soon as the
completions are on the host: decoding them to text and grading them run on a host
thread (the verifier may fan out to worker processes), so the caller can dispatch
device work (the log-prob passes) before it waits on `Pending.result()`, and the host
work of the step overlaps the devices' work.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np

from isojax.models import sharding
from isojax.models.tokenizer import TextTokenizer
from isojax.sampling import sampler
from isojax.sampling import settings as sampling_settings
from isojax.tasks.problem import Problem, Verifier
from isojax.tasks.prompts import PromptBook


@dataclasses.dataclass
class ScoredRollouts:
  prompts_GP: np.ndarray       # [G, P] int32, left-padded
  prompt_mask_GP: np.ndarray   # [G, P] bool
  rollouts: sampler.Rollouts   # [B, T] host NumPy arrays, B = G * n
  rewards_GN: np.ndarray       # [G, n] float32, verified rewards (unequal groups: padded
                               # with 0 to the largest group; `valid_GN` marks the real ones)
  completions: list[str]       # [B] decoded text
  verifier_timeouts: int = 0
  verifier_errors: int = 0
  timings: dict[str, float] = dataclasses.field(default_factory=dict)  # seconds, by phase
  versions_B2: np.ndarray | None = None  # [B, 2] int: oldest, newest policy version of
                                         # each rollout's tokens (in-flight sampling only)
  group_sizes: np.ndarray | None = None  # [G] int rollouts of each problem (per-problem
                                         # allocation); None: n each

  @property
  def num_tokens(self) -> int:
    return int(self.rollouts.mask.sum())

  @property
  def valid_GN(self) -> np.ndarray | None:
    """[G, N] bool, the real entries of `rewards_GN` (None: every entry, equal groups)."""
    return None if self.group_sizes is None else groups_mask(self.group_sizes,
                                                             self.rewards_GN.shape[1])

  @property
  def rewards_B(self) -> np.ndarray:
    """[B] float32 verified rewards in rollout order."""
    valid = self.valid_GN
    return self.rewards_GN.reshape(-1) if valid is None else self.rewards_GN[valid]

  @property
  def owner_B(self) -> np.ndarray:
    """[B] int, the problem (index among the G) of each rollout."""
    g, n = self.rewards_GN.shape
    sizes = np.full(g, n) if self.group_sizes is None else self.group_sizes
    return np.repeat(np.arange(g), sizes)

  def as_groups(self, values_B: np.ndarray) -> np.ndarray:
    """[G, N] from per-rollout [B] values (unequal groups: 0 on the padding)."""
    return as_groups(values_B, *self.rewards_GN.shape, self.group_sizes)

  @property
  def prompt_len(self) -> int:
    return self.prompts_GP.shape[1]

  @property
  def truncated_fraction(self) -> float:
    return float(1.0 - self.rollouts.finished.mean())


@dataclasses.dataclass
class Pending:
  """Sampled rollouts whose text and grades may still be computing on the host thread."""
  prompts_GP: np.ndarray
  prompt_mask_GP: np.ndarray
  rollouts: sampler.Rollouts
  graded: concurrent.futures.Future  # of (completions, Grades, timings)
  n: int                             # rollouts per problem (unequal groups: the most)
  sample_s: float                    # dispatch until the rollouts were on the host
  versions_B2: np.ndarray | None = None
  group_sizes: np.ndarray | None = None  # [G] (per-problem allocation); None: n each

  @property
  def prompt_len(self) -> int:
    return self.prompts_GP.shape[1]

  def result(self) -> ScoredRollouts:
    start = time.perf_counter()
    completions, grades, timings = self.graded.result()
    g = self.prompts_GP.shape[0]
    timings = dict(timings, sample_s=self.sample_s, grade_wait_s=time.perf_counter() - start)
    rewards_GN = as_groups(np.asarray(grades.rewards, np.float32), g, self.n,
                           self.group_sizes)
    return ScoredRollouts(self.prompts_GP, self.prompt_mask_GP, self.rollouts, rewards_GN,
                          completions, grades.timeouts, grades.errors, timings,
                          self.versions_B2, self.group_sizes)


def groups_mask(sizes_G: np.ndarray, n: int) -> np.ndarray:
  """[G, n] bool: entry j of group g is a real rollout (j < sizes_G[g])."""
  return np.arange(n)[None, :] < np.asarray(sizes_G)[:, None]


def as_groups(values_B: np.ndarray, g: int, n: int, sizes_G: np.ndarray | None
              ) -> np.ndarray:
  """[G, n] from per-rollout [B] values in rollout order: n each (sizes None), or
  `sizes_G[g]` each, padded with 0."""
  values_B = np.asarray(values_B)
  if sizes_G is None:
    return values_B.reshape(g, n)
  out = np.zeros((g, n), values_B.dtype)
  out[groups_mask(sizes_G, n)] = values_B
  return out


# One host thread decodes and grades, in submission order, beside the device work.
_HOST_WORK = concurrent.futures.ThreadPoolExecutor(max_workers=1,
                                                   thread_name_prefix="isojax-grading")


def _decode_and_grade(tok: TextTokenizer, tokens_BT: np.ndarray, problems: Sequence[Problem],
                      verifier: Verifier):
  start = time.perf_counter()
  completions = [tok.decode(row) for row in tokens_BT]
  decoded = time.perf_counter()
  grades = verifier.grade_async(completions, problems).result()
  return completions, grades, dict(decode_s=decoded - start,
                                   grade_s=time.perf_counter() - decoded)


@dataclasses.dataclass(frozen=True)
class InFlight:
  """Weights that may change while a call decodes (PipelineRL's in-flight updates):
  `weights()` gives the newest (version, params); they are read again every `segment`
  tokens, and the tokens after take the new policy (the cache keeps the old weights')."""
  weights: Callable[[], tuple[int, Any]]
  segment: int


def _decode_in_flight(graphdef, in_flight: InFlight, prompts, mask, rng,
                      spec: sampler.SampleSpec) -> tuple[sampler.Rollouts, np.ndarray]:
  """One lockstep call whose weights may change between segments; the rollouts and the
  [B, 2] (oldest, newest) version of each rollout's tokens.

  A token's version is that of the weights that computed the logits it was drawn from:
  token 0 the prefill's, token p the weights of the segment that ran step p - 1.
  """
  first_version, params = in_flight.weights()
  decoding = sampler.start(graphdef, params, prompts, mask, rng, spec)
  starts, versions = [], []  # each segment's first step and its weights' version
  while True:
    step = int(decoding.step)
    if step >= spec.max_new_tokens or sharding.to_host(decoding.done).all():
      break
    version, params = in_flight.weights()
    starts.append(step)
    versions.append(version)
    decoding = sampler.advance(graphdef, params, decoding, step + in_flight.segment, spec)
  rollouts = sampler.finish(decoding, spec)
  lengths_B = sharding.to_host(rollouts.lengths)
  # The segment that ran step L - 2 computed the logits of the last token (L >= 2).
  segment_B = np.searchsorted(starts, lengths_B - 2, side="right") - 1
  newest_B = np.where(lengths_B >= 2, np.asarray(versions + [first_version])[segment_B],
                      first_version)
  return rollouts, np.stack([np.full_like(newest_B, first_version), newest_B], axis=1)


def sample(graphdef, params, tok: TextTokenizer, book: PromptBook, problems: Sequence[Problem],
           verifier: Verifier, *, n: int, rng: jax.Array, sampling: sampling_settings.SamplingSettings,
           temperature: float | None = None, in_flight: InFlight | None = None,
           group_sizes: np.ndarray | None = None, n_max: int = 0) -> Pending:
  """Samples n rollouts per problem; decoding and grading go on on the host thread.

  Runs on the mesh the parameters live on, each device decoding its share of the
  problems, in calls of at most `sampling.max_rollouts_per_call` rollouts (0: one
  call) so that one call's decode cache fits; see `call_plan`. With `in_flight`
  (lockstep decoding only) the weights come from it, and may change between segments
  of a call: `params` is ignored and `Pending.versions_B2` says which versions wrote
  each rollout.

  With `group_sizes` [G] (per-problem allocation) problem g gets `group_sizes[g]` of
  at most `n_max` rollouts instead, the G * n in all spread so that each call's and
  each data-parallel shard's problems hold n a problem on average (`allocation_blocks`
  gives those blocks); `Pending.result` pads the groups to `n_max`.
  """
  start = time.perf_counter()
  if in_flight is not None:
    params = in_flight.weights()[1]
  prompts, mask = book.batch(problems)
  mesh = params_mesh(params)
  shards = sharding.batch_shards(mesh)
  per_call, num_calls = call_plan(len(problems), n, sampling.max_rollouts_per_call, shards)
  rows = np.resize(np.arange(len(problems)), per_call * num_calls)  # pad by repetition
  call_groups = _call_groups(group_sizes, n, n_max, len(rows), per_call, shards, in_flight)
  spec = sample_spec(sampling, n=n if group_sizes is None else n_max,
                     rollouts_per_call=per_call * n, shards=shards,
                     stop_ids=tok.eos_ids, pad_id=tok.pad_id, temperature=temperature,
                     interruption=interruption(sampling, tok))
  parts, versions = [], []
  with contextlib.ExitStack() as stack:
    if mesh is not None:
      stack.enter_context(jax.set_mesh(mesh))
    for call in range(num_calls):
      take = rows[call * per_call:(call + 1) * per_call]
      batch = (prompts[take], mask[take])
      if mesh is not None:
        batch = sharding.shard_batch(batch, mesh)
      # Call 0 uses `rng` itself: a step sampled in one call draws what it always did.
      call_rng = jax.random.fold_in(rng, call) if call else rng
      if in_flight is None:
        group_B = call_groups[call] if call_groups else None
        if group_B is not None and mesh is not None:
          group_B = jax.device_put(group_B, sharding.batch_sharding(mesh, 1))
        parts.append(sampler.sample(graphdef, params, *batch, call_rng, spec, group_B))
      else:
        part, versions_B2 = _decode_in_flight(graphdef, in_flight, *batch, call_rng, spec)
        parts.append(part)
        versions.append(versions_B2)
  host = [jax.tree.map(sharding.to_host, part) for part in parts]
  # The real problems' rollouts come first (the padding repeats problems at the end).
  rollouts = jax.tree.map(lambda *xs: np.concatenate(xs)[:len(problems) * n], *host)
  versions_B2 = np.concatenate(versions)[:len(problems) * n] if versions else None
  owner_B = np.repeat(np.arange(len(problems)), n if group_sizes is None else group_sizes)
  graded = _HOST_WORK.submit(_decode_and_grade, tok, rollouts.tokens,
                             [problems[i] for i in owner_B], verifier)
  return Pending(prompts, mask, rollouts, graded, n if group_sizes is None else n_max,
                 sample_s=time.perf_counter() - start, versions_B2=versions_B2,
                 group_sizes=None if group_sizes is None else np.asarray(group_sizes))


def _call_groups(group_sizes, n: int, n_max: int, rows: int, per_call: int, shards: int,
                 in_flight) -> list[np.ndarray] | None:
  """Each sampler call's `group_B` (None: equal groups): the padding problems of the last
  call get n each; ValueError where the sizes do not fit the calls and shards."""
  if group_sizes is None:
    return None
  if in_flight is not None:
    raise ValueError("unequal groups are not sampled in flight (rl.allocation='per_problem' "
                     "needs rl.off_policy other than 'pipeline_in_flight')")
  sizes = np.asarray(group_sizes, np.int64)
  if sizes.sum() != sizes.size * n:
    raise ValueError(f"group sizes sum to {sizes.sum()} rollouts: expected {sizes.size} "
                     f"problems x {n}")
  sizes = np.concatenate([sizes, np.full(rows - sizes.size, n)])
  return [sampler.group_index(sizes[c:c + per_call], n_max, shards)
          for c in range(0, rows, per_call)]


def allocation_blocks(num_problems: int, n: int, max_rollouts_per_call: int, shards: int
                      ) -> list[np.ndarray]:
  """The problems (indices) of each sampler call's data-parallel shard, in order: unequal
  groups spend n a problem on average within each, as `sample` needs."""
  per_call, num_calls = call_plan(num_problems, n, max_rollouts_per_call, shards)
  per_shard = per_call // shards
  blocks = [np.arange(start, min(start + per_shard, num_problems))
            for start in range(0, per_call * num_calls, per_shard)]
  return [b for b in blocks if b.size]


def params_mesh(params) -> jax.sharding.Mesh | None:
  """The mesh the parameters are placed on (None for single-device arrays)."""
  leaf_sharding = getattr(jax.tree.leaves(params)[0], "sharding", None)
  return leaf_sharding.mesh if isinstance(leaf_sharding, jax.sharding.NamedSharding) else None


def call_plan(num_problems: int, n: int, max_rollouts_per_call: int, shards: int
              ) -> tuple[int, int]:
  """(problems per sampler call, number of calls) for `num_problems` problems.

  A call holds whole groups, a multiple of `shards` problems (each data-parallel
  device gets the same number) and at most `max_rollouts_per_call` rollouts (0: no
  limit). The last call is padded with repeated problems whose rollouts are dropped.
  """
  per_call = -(-num_problems // shards) * shards  # everything, padded to whole shards
  if max_rollouts_per_call:
    fits = max_rollouts_per_call // n // shards * shards
    if not fits:
      raise ValueError(f"sampling.max_rollouts_per_call={max_rollouts_per_call} cannot hold "
                       f"{shards} problem(s) (one per data-parallel device) of {n} rollouts")
    per_call = min(per_call, fits)
  return per_call, -(-num_problems // per_call)


def interruption(sampling: sampling_settings.SamplingSettings, tok: TextTokenizer
                 ) -> sampler.Interruption | None:
  """`sampling`'s forced interruption in token ids (None when `think_budget` is 0).

  Raises, naming the field, when the interruption text holds a stop id (it would end
  the rollout) or does not fit between the budgets and `max_new_tokens`.
  """
  if not sampling.think_budget:
    return None
  def encode(field: str) -> tuple[int, ...]:
    text = getattr(sampling, field)
    try:
      ids = tuple(tok.encode(text, add_bos=False))
    except Exception as e:  # pylint: disable=broad-except  # tokenizers raises bare Exception
      raise ValueError(f"sampling.{field}={text!r} cannot be written with the policy's "
                       f"tokenizer: {e}") from None
    if not ids or tok.decode(ids, skip_special_tokens=False) != text:
      raise ValueError(f"sampling.{field}={text!r} does not round-trip through the policy's "
                       f"tokenizer (it decodes {ids} to {tok.decode(ids)!r})")
    return ids

  text_ids, end_ids = encode("interruption_text"), encode("think_end_text")
  if set(text_ids) & set(tok.eos_ids):
    raise ValueError(f"sampling.interruption_text={sampling.interruption_text!r} encodes to "
                     f"a stop id of the tokenizer ({sorted(set(text_ids) & set(tok.eos_ids))})")
  cut = sampler.Interruption(sampling.think_budget, text_ids, sampling.answer_budget, end_ids)
  if cut.end > sampling.max_new_tokens:
    raise ValueError(
        f"sampling.think_budget={cut.think_budget} + the interruption text's {len(text_ids)} "
        f"tokens + sampling.answer_budget={cut.answer_budget} exceed "
        f"sampling.max_new_tokens={sampling.max_new_tokens}")
  return cut


def sample_spec(sampling: sampling_settings.SamplingSettings, *, n: int, rollouts_per_call: int,
                shards: int, stop_ids: tuple[int, ...], pad_id: int,
                temperature: float | None = None,
                interruption: sampler.Interruption | None = None) -> sampler.SampleSpec:
  """The sampler's settings for one call of `rollouts_per_call` rollouts from
  the `sampling` settings, the tokenizer's stop and pad ids and the call's device shards.

  `sampling.decode_slots` (0: lockstep decoding) and `sampling.decode_slots_min` (0: the
  slots never shrink) are each rounded up to a multiple of `shards`; more slots than the
  call's rollouts would only decode empty rows. `temperature` overrides
  `sampling.temperature` (evaluation). `interruption` is `interruption(sampling, tok)`.
  """
  def per_call(slots: int, limit: int) -> int:
    return -(-min(slots, limit) // shards) * shards if slots else 0
  num_slots = per_call(sampling.decode_slots, rollouts_per_call)
  return sampler.SampleSpec(
      n=n, max_new_tokens=sampling.max_new_tokens,
      temperature=float(sampling.temperature if temperature is None else temperature),
      stop_ids=tuple(stop_ids), pad_id=pad_id, top_k=int(sampling.top_k),
      top_p=float(sampling.top_p), weights_dtype=sampling.weights_dtype or None,
      dtype=sampling.dtype or None, num_slots=num_slots,
      min_slots=per_call(sampling.decode_slots_min, num_slots),
      decode_block=sampling.decode_block, interruption=interruption)


def generate(graphdef, params, tok: TextTokenizer, book: PromptBook, problems: Sequence[Problem],
             verifier: Verifier, *, n: int, rng: jax.Array, sampling: sampling_settings.SamplingSettings,
             temperature: float | None = None, in_flight: InFlight | None = None,
             group_sizes: np.ndarray | None = None, n_max: int = 0) -> ScoredRollouts:
  """`sample` and wait for the grades."""
  return sample(graphdef, params, tok, book, problems, verifier, n=n, rng=rng,
                sampling=sampling, temperature=temperature, in_flight=in_flight,
                group_sizes=group_sizes, n_max=n_max).result()


def sequences(scored: ScoredRollouts | Pending, n: int) -> tuple[np.ndarray, np.ndarray]:
  """Prompt + response tokens [B, P + T] and their real-token mask, for scoring (each
  prompt n times, or `group_sizes[g]` times with unequal groups)."""
  repeats = n if scored.group_sizes is None else scored.group_sizes
  prompts = np.repeat(scored.prompts_GP, repeats, axis=0)
  prompt_mask = np.repeat(scored.prompt_mask_GP, repeats, axis=0)
  tokens = np.concatenate([prompts, scored.rollouts.tokens], axis=1)
  mask = np.concatenate([prompt_mask, scored.rollouts.mask], axis=1)
  return tokens, mask
