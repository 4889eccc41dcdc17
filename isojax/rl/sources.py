"""Where each step's rollouts come from: one interface, four ways of sampling.

`RolloutSource.next_batch(step, learner) -> Batch` gives the rollouts update `step`
trains on; the loop (`train.run`) does the same with them whichever source made them.

  Synchronous      samples with the policy this step updates (the default)
  DynamicSampling  rounds of B_p problems until B_p groups carry a signal (DAPO,
                   `rl.dynamic_sampling`; rl/dynamic_sampling.py)
  Pipelined        the batch sampled ahead by the policy k updates older (PipelineRL-k,
                   `rl.max_staleness`; rl/off_policy.py), with or without dynamic sampling
  InFlight         batches from a free-running thread whose weights change mid-rollout
                   (`rl.off_policy=pipeline_in_flight`)

Each source owns its state: what a checkpoint holds of it (`checkpoint_tree`), what a
stop now would discard (`discarded_rollouts`) and its threads (`close`). `Problems`
is what they share: which problems a step samples, and the sampling itself.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import threading
from typing import Any, Callable

import jax
import numpy as np

from isojax.models import sharding
from isojax.rl import advantages, dynamic_sampling, off_policy, problem_pool, rollout
from isojax.rl import rollout_allocation
from isojax.rl import batch as rl_batch
from isojax.rl import settings as rl_settings
from isojax.sampling import settings as sampling_settings


def problems_for_step(seed: int, step: int, num_problems: int, batch: int) -> np.ndarray:
  """Indices of the B_p problems of update `step`: epoch-wise shuffles, stateless."""
  out = []
  position = step * batch
  while len(out) < batch:
    epoch, offset = divmod(position, num_problems)
    order = np.random.default_rng([seed, epoch]).permutation(num_problems)
    take = order[offset:offset + batch - len(out)]
    out.extend(take.tolist())
    position += len(take)
  return np.asarray(out)


@dataclasses.dataclass
class Batch:
  """The rollouts one update trains on, and what making them cost."""
  scored: rollout.ScoredRollouts
  active_problems: int             # training problems still in the pool
  generated_rollouts: int          # sampled for this step: extra rounds, dropped batches
  batches: int                     # rollout batches consumed (trained or dropped)
  prefetched: Any = None           # (old, reference) log-probs dispatched while grading
  rollout_wait_s: float | None = None  # what the learner waited for a batch sampled ahead
  metrics: dict[str, Any] = dataclasses.field(default_factory=dict)  # the source's own


@dataclasses.dataclass
class Problems:
  """The training problems and how a step samples them: ids are functions of (seed,
  step, round), or drawn from No-Positive-Resampling's pool; keys of (step, round)."""
  seed: int                        # the run's seed: problem order and draws
  n: int                           # rollouts per problem
  b_p: int                         # problems per batch
  rl: rl_settings.RLSettings
  sampling: sampling_settings.SamplingSettings
  graphdef: Any
  tok: Any
  book: Any
  train_problems: list
  verifier: Any
  pool: problem_pool.ProblemPool | None  # pass history; it retires problems under NPR
  sample_key: jax.Array
  profile: rollout_allocation.Profile | None = None  # per-problem allocation's priors

  @property
  def _retiring(self) -> bool:
    return self.pool is not None and self.pool.retires

  def choose(self, step: int) -> np.ndarray:
    """The B_p training-problem ids of update `step`."""
    if not self._retiring:
      return problems_for_step(self.seed, step, len(self.train_problems), self.b_p)
    return self.pool.sample(np.random.default_rng([self.seed, step]), self.b_p)

  def active(self) -> int:
    return int(self.pool.active_ids().size) if self._retiring else len(self.train_problems)

  def record(self, chosen: np.ndarray, scored: rollout.ScoredRollouts) -> None:
    """The pool learns the rewards of the problems it gave (when there is a pool)."""
    if self.pool is not None:
      self.pool.update(chosen[scored.owner_B], scored.rewards_B)

  def group_sizes(self, chosen: np.ndarray, params) -> np.ndarray | None:
    """[B_p] rollouts of each chosen problem (None: n each, `rl.allocation='uniform'`):
    the step's B_p * n split by the problems' estimated pass rates
    (`rollout_allocation.allocate`), within each sampler call's data-parallel shard."""
    if not self.rl.per_problem:
      return None
    n_min, n_max = self.rl.group_bounds(self.n)
    profile = self.profile or rollout_allocation.Profile.of(
        [p.prompt for p in self.train_problems], {}, 0, self.rl.allocation_prior_mean,
        self.rl.allocation_prior_strength)  # nothing profiled: the prior alone
    history = self.pool or problem_pool.ProblemPool(len(self.train_problems), threshold=0.0)
    p_G = profile.estimate(chosen, history.successes_G, history.attempts_G)
    sizes = np.zeros(len(chosen), np.int64)
    shards = sharding.batch_shards(rollout.params_mesh(params))
    for block in rollout.allocation_blocks(len(chosen), self.n,
                                           self.sampling.max_rollouts_per_call, shards):
      sizes[block] = rollout_allocation.allocate(p_G[block], self.n * block.size, n_min, n_max)
    return sizes

  def generate(self, chosen: np.ndarray, params, key: jax.Array, **kwargs
               ) -> rollout.ScoredRollouts:
    return rollout.generate(self.graphdef, params, self.tok, self.book,
                            [self.train_problems[i] for i in chosen], self.verifier,
                            n=self.n, rng=key, sampling=self.sampling, **kwargs)

  def draw(self, step: int, params, round_index: int
           ) -> tuple[np.ndarray, rollout.ScoredRollouts]:
    """Round `round_index` of the problems of `step`, sampled by `params` and graded."""
    step_key = jax.random.fold_in(self.sample_key, step)
    if round_index == 0:
      chosen, key = self.choose(step), step_key
    else:  # dynamic sampling's further rounds
      key = jax.random.fold_in(step_key, round_index)
      chosen = (dynamic_sampling.extra_problems(self.seed, step, round_index,
                                                len(self.train_problems), self.b_p)
                if self.pool is None else
                self.pool.sample(np.random.default_rng([self.seed, step, round_index]),
                                 self.b_p))
    sizes = self.group_sizes(chosen, params)
    scored = self.generate(chosen, params, key, **(
        {} if sizes is None else dict(group_sizes=sizes, n_max=self.rl.group_bounds(self.n)[1])))
    self.record(chosen, scored)
    return chosen, scored

  def collect(self, step: int, params) -> dynamic_sampling.Collected:
    """The groups `step` trains on: one round, or rounds until B_p carry a signal."""
    if not self.rl.dynamic_sampling:
      chosen, scored = self.draw(step, params, 0)
      return dynamic_sampling.Collected(chosen, scored, scored.rewards_B.size, rounds=1)
    return dynamic_sampling.collect(
        functools.partial(self.draw, step, params), problems_per_batch=self.b_p,
        max_rounds=self.rl.dynamic_sampling_max_rounds,
        informative=lambda scored: ~advantages.zero_variance_groups(
            rl_batch.training_rewards(self.rl, scored,
                                      max_new_tokens=self.sampling.max_new_tokens),
            scored.valid_GN),
        max_rows=self.b_p * self.n if self.rl.per_problem else 0)


class RolloutSource(abc.ABC):
  """The interface; see the module docstring."""

  @abc.abstractmethod
  def next_batch(self, step: int, learner) -> Batch:
    """The rollouts update `step` trains on; `learner.params` is the policy it updates."""

  def checkpoint_tree(self) -> dict[str, Any] | None:
    """The checkpoint item `queue`: what a resume needs of this source (None: nothing)."""
    return None

  def discarded_rollouts(self) -> int | None:
    """Rollouts sampled and not yet trained that a stop now would lose (None: none are
    ever lost, they are in `checkpoint_tree` or not sampled yet)."""
    return None

  def close(self) -> None:
    pass


@dataclasses.dataclass
class Synchronous(RolloutSource):
  """Samples the step's problems with the policy this step updates. The log-prob passes
  are dispatched before the verifier's grades are waited on (`Learner.prefetch`)."""
  problems: Problems

  def next_batch(self, step: int, learner) -> Batch:
    p = self.problems
    chosen = p.choose(step)
    pending = rollout.sample(p.graphdef, learner.params, p.tok, p.book,
                             [p.train_problems[i] for i in chosen], p.verifier, n=p.n,
                             rng=jax.random.fold_in(p.sample_key, step),
                             sampling=p.sampling,
                             group_sizes=p.group_sizes(chosen, learner.params),
                             n_max=p.rl.group_bounds(p.n)[1])
    prefetched = learner.prefetch(pending)  # devices score while the host decodes and grades
    scored = pending.result()
    p.record(chosen, scored)
    return Batch(scored, p.active(), generated_rollouts=p.n * p.b_p, batches=1,
                 prefetched=prefetched)


@dataclasses.dataclass
class DynamicSampling(RolloutSource):
  """Rounds with the policy this step updates until B_p groups are informative."""
  problems: Problems

  def next_batch(self, step: int, learner) -> Batch:
    collected = self.problems.collect(step, learner.params)
    return Batch(collected.scored, self.problems.active(),
                 generated_rollouts=collected.generated_rollouts, batches=1,
                 metrics=dynamic_sampling.metrics(collected.generated_rollouts,
                                                  collected.rounds))


def _off_policy_batch(generated: off_policy.Generated, step: int, wait_s: float,
                      rl: rl_settings.RLSettings, batches: int) -> Batch:
  values = (dynamic_sampling.metrics(generated.generated, generated.rounds)
            if rl.dynamic_sampling else {})
  values.update(off_policy.staleness_metrics(generated, step, rl.max_staleness))
  return Batch(generated.scored, generated.active_problems,
               generated_rollouts=generated.generated + generated.dropped,  # dropped: sampled
               batches=batches, rollout_wait_s=wait_s, metrics=values)


class Pipelined(RolloutSource):
  """Step s's batch sampled by the policy `off_policy.source_version` names, ahead of
  the update, on a host thread; the batches sampled ahead are checkpointed."""

  def __init__(self, problems: Problems, *, num_steps: int, queued: list,
               snapshot: Callable[[Any], Any] | None):
    self._rl = problems.rl

    def sample_step(step: int, version: int, params) -> off_policy.Generated:
      collected = problems.collect(step, params)
      return off_policy.Generated(step, version, collected.chosen, collected.scored,
                                  problems.active(), generated=collected.generated_rollouts,
                                  rounds=collected.rounds)
    self._generator = off_policy.Generator(
        sample_step, max_staleness=self._rl.max_staleness,
        mode=self._rl.off_policy, num_steps=num_steps, queued=queued,
        snapshot=snapshot)

  def next_batch(self, step: int, learner) -> Batch:
    self._generator.publish(step, learner.params)
    generated, wait_s = self._generator.take(step)
    return _off_policy_batch(generated, step, wait_s, self._rl, batches=1)

  def checkpoint_tree(self) -> dict[str, Any]:
    # Waiting for the queued batches leaves the pool as they left it.
    return off_policy.queue_tree(self._generator.queued())

  def close(self) -> None:
    self._generator.close()


class InFlight(RolloutSource):
  """Batches from a free-running thread (`off_policy.InFlightGenerator`); nothing queued
  is checkpointed, so a resume samples again from the batch after the last consumed."""

  def __init__(self, problems: Problems, *, first_batch: int,
               snapshot: Callable[[Any], Any] | None):
    self._rl = problems.rl
    self._consumed = 0  # batches taken or dropped since the last next_batch
    lock = threading.Lock()  # the generator chooses while the learner records

    def sample_batch(index: int, in_flight: rollout.InFlight) -> off_policy.Generated:
      with lock:
        chosen, active = problems.choose(index), problems.active()
      scored = problems.generate(chosen, None, jax.random.fold_in(problems.sample_key, index),
                                 in_flight=in_flight)
      return off_policy.Generated(index, int(scored.versions_B2[:, 0].min()), chosen, scored,
                                  active)

    def consumed(generated: off_policy.Generated) -> None:
      self._consumed += 1
      with lock:
        problems.record(generated.chosen, generated.scored)

    self._generator = off_policy.InFlightGenerator(
        sample_batch, max_staleness=self._rl.max_staleness, first_batch=first_batch,
        in_flight_tokens=self._rl.in_flight_tokens, consumed=consumed,
        snapshot=snapshot)

  def next_batch(self, step: int, learner) -> Batch:
    self._generator.publish(step, learner.params)
    generated, wait_s = self._generator.take(step)
    batches, self._consumed = self._consumed, 0
    return _off_policy_batch(generated, step, wait_s, self._rl, batches=batches)

  def checkpoint_tree(self) -> dict[str, Any]:
    return off_policy.queue_tree(self._generator.queued())  # empty: see the class

  def discarded_rollouts(self) -> int:
    return self._generator.unconsumed_rollouts()

  def close(self) -> None:
    self._generator.close()


def make(problems: Problems, *, num_steps: int, batches: int, queue: dict | None,
         snapshot: Callable[[Any], Any] | None) -> RolloutSource:
  """The source `problems.rl` asks for; `batches` and `queue` as restored."""
  rl = problems.rl
  if rl.max_staleness and rl.off_policy == "pipeline_in_flight":
    return InFlight(problems, first_batch=batches, snapshot=snapshot)
  if rl.max_staleness:
    return Pipelined(problems, num_steps=num_steps, queued=off_policy.restore_queue(queue),
                     snapshot=snapshot)
  if rl.dynamic_sampling:
    return DynamicSampling(problems)
  return Synchronous(problems)
