"""Off-policy generation with a staleness bound: sampling runs ahead of the update.

With `rl.max_staleness` = k > 0 the rollouts of update step s may come from a policy
up to k updates old, so the next batches are sampled while the current one trains.
The *version* of a policy is the number of updates applied to it (the learner trains
step s with version s). `source_version` is the deterministic schedule of ScaleRL's
two off-policy setups:

- `pipeline` (PipelineRL-k): step s is sampled by version max(0, s - k). The generator
  is always k batches ahead: once version v exists it samples step v + k, while the
  learner trains steps v .. v + k - 1 from the batches already queued.
- `ppo_off_policy` (PPO-off-policy-k): one version samples the batches of k successive
  steps; steps v .. v + k - 1 (v a multiple of k) are sampled by version v, so their
  staleness is 0 .. k - 1.

The rollouts of a step are a function of (the version that samples them, the step),
because each step's problems and random key are (`sources.problems_for_step`,
`fold_in(key, step)`); the batches are generated in step order on one host thread, so
No-Positive-Resampling's pool sees the same rewards in the same order on every run. A
run is therefore reproducible, and the batches sampled but not yet trained are saved
with the checkpoint (`Generated.to_tree`): a resumed run trains exactly those, and
samples the next ones from the restored parameters, as the uninterrupted run did.

The losses take the sampler's log-probs as the old policy of their ratios
(`RLSettings.ratio_to_sampler`): the log-prob each token had under the version that
sampled it. There is no recomputed old policy in this mode, so the truncated-IS weight
(which corrects recomputed towards sampler log-probs) is 1.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import queue
import threading
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from isojax import metrics
from isojax.rl import rollout
from isojax.rl.settings import OFF_POLICY_MODES
from isojax.sampling import sampler


def source_version(step: int, max_staleness: int, mode: str) -> int:
  """The policy version that samples the rollouts of update `step`."""
  if mode not in OFF_POLICY_MODES:
    raise ValueError(f"rl.off_policy={mode!r}: expected one of {OFF_POLICY_MODES}")
  if max_staleness == 0:
    return step
  if mode == "pipeline":
    return max(0, step - max_staleness)
  return step - step % max_staleness


@dataclasses.dataclass
class Generated:
  """The rollouts of one update step and where they came from."""
  step: int                 # the update step that trains on them
  version: int              # the policy version that sampled them
  chosen: np.ndarray        # [B_p] int, training-problem ids
  scored: rollout.ScoredRollouts
  active_problems: int      # the pool's active problems when they were chosen
  dropped: int = 0          # rollouts dropped as too stale before this batch (in flight)
  generated: int = 0        # rollouts sampled for it (dynamic sampling's rounds); 0: B_p * n
  rounds: int = 1           # dynamic sampling's rounds

  def __post_init__(self):
    self.generated = self.generated or int(self.scored.rewards_B.size)

  def oldest_B(self) -> np.ndarray:
    """[B] the version that began each rollout."""
    versions = self.scored.versions_B2
    return (np.full(self.scored.rewards_B.size, self.version) if versions is None
            else versions[:, 0])

  def to_tree(self) -> dict[str, Any]:
    """NumPy arrays and scalars for the checkpoint (the completions' text is not kept);
    `group_sizes` only with unequal groups, so equal ones keep their checkpoint's layout."""
    s = self.scored
    sizes = {} if s.group_sizes is None else dict(group_sizes=np.asarray(s.group_sizes,
                                                                         np.int32))
    return dict(**sizes, step=np.int32(self.step), version=np.int32(self.version),
                chosen=np.asarray(self.chosen, np.int32),
                active_problems=np.int32(self.active_problems),
                prompts=s.prompts_GP, prompt_mask=s.prompt_mask_GP, tokens=s.rollouts.tokens,
                logprobs=s.rollouts.logprobs, mask=s.rollouts.mask,
                finished=s.rollouts.finished, forced=s.rollouts.forced, rewards=s.rewards_GN,
                verifier=np.asarray([s.verifier_timeouts, s.verifier_errors], np.int32),
                sampling=np.asarray([self.generated, self.rounds], np.int64),
                timings=np.asarray([s.timings.get(k, 0.0) for k in metrics.TIMED_PHASES],
                                   np.float32))

  @classmethod
  def from_tree(cls, tree: dict[str, Any]) -> "Generated":
    a = {k: np.asarray(v) for k, v in tree.items()}
    rollouts = sampler.Rollouts(tokens=a["tokens"], logprobs=a["logprobs"], mask=a["mask"],
                                finished=a["finished"], forced=a["forced"])
    scored = rollout.ScoredRollouts(a["prompts"], a["prompt_mask"], rollouts, a["rewards"],
                                    completions=[], verifier_timeouts=int(a["verifier"][0]),
                                    verifier_errors=int(a["verifier"][1]),
                                    timings=dict(zip(metrics.TIMED_PHASES,
                                                     a["timings"].tolist())),
                                    group_sizes=a.get("group_sizes"))
    return cls(step=int(a["step"]), version=int(a["version"]), chosen=a["chosen"],
               scored=scored, active_problems=int(a["active_problems"]),
               generated=int(a["sampling"][0]), rounds=int(a["sampling"][1]))


def staleness_metrics(generated: Generated, learner_version: int, max_staleness: int
                      ) -> dict[str, Any]:
  """A trained batch's staleness: how many updates older than the learner's the policy
  that began each rollout was. `train/staleness_max`, `train/staleness_histogram` (the
  rollouts by staleness 0..k); in flight also `train/spanning_fraction` (rollouts whose
  tokens come from more than one version) and `train/dropped_rollouts`."""
  staleness_B = learner_version - generated.oldest_B()
  if staleness_B.min() < 0 or staleness_B.max() > max_staleness:
    raise AssertionError(f"step {generated.step}: rollouts begun by versions "
                         f"{sorted(set(generated.oldest_B().tolist()))} trained at version "
                         f"{learner_version}, beyond rl.max_staleness={max_staleness}")
  out = {"train/staleness_max": int(staleness_B.max()),
         "train/staleness_histogram": np.bincount(staleness_B, minlength=max_staleness + 1
                                                  ).tolist()}
  versions = generated.scored.versions_B2
  if versions is not None:
    out["train/spanning_fraction"] = float(np.mean(versions[:, 1] > versions[:, 0]))
    out["train/dropped_rollouts"] = generated.dropped
  return out


class Generator:
  """Samples the batch of each step with the version `source_version` names.

  `publish(version, params)` hands the generator the learner's newest parameters; every
  step that version samples is queued on one host thread, in step order, so sampling
  overlaps the learner's update of the steps before. The parameters are copied first,
  by `snapshot` (default: a copy on the same devices; `sharding.on_mesh` to sample on
  devices of their own): the update donates (overwrites) the learner's. `take(step)`
  waits for that step's batch. `sample_step(step, version, params) -> Generated`
  chooses, samples and grades one step.
  """

  def __init__(self, sample_step: Callable[[int, int, Any], Generated], *, max_staleness: int,
               mode: str, num_steps: int, queued: list[Generated] = (),
               snapshot: Callable[[Any], Any] | None = None):
    if max_staleness < 1:
      raise ValueError(f"rl.max_staleness={max_staleness}: the generator runs ahead by >= 1")
    self._sample_step = sample_step
    self._snapshot = snapshot or (lambda params: jax.tree.map(jnp.copy, params))
    self._k, self._mode, self._num_steps = max_staleness, mode, num_steps
    self._batches: dict[int, concurrent.futures.Future] = {}
    for generated in queued:
      done = concurrent.futures.Future()
      done.set_result(generated)
      self._batches[generated.step] = done
    self._next = max((g.step + 1 for g in queued), default=0)
    self._thread = concurrent.futures.ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="isojax-generator")

  def publish(self, version: int, params: Any) -> None:
    """Queues every step not yet queued whose sampling version is at most `version`."""
    snapshot = None
    while (self._next < self._num_steps
           and source_version(self._next, self._k, self._mode) <= version):
      if snapshot is None:
        snapshot = self._snapshot(params)
      self._batches[self._next] = self._thread.submit(self._sample_step, self._next, version,
                                                      snapshot)
      self._next += 1

  def take(self, step: int) -> tuple[Generated, float]:
    """The batch of `step` (removed from the queue) and the seconds waited for it."""
    if step not in self._batches:
      raise RuntimeError(f"step {step} was never queued: publish its sampling version "
                         f"{source_version(step, self._k, self._mode)} first")
    start = time.perf_counter()
    generated = self._batches.pop(step).result()
    return generated, time.perf_counter() - start

  def queued(self) -> list[Generated]:
    """The batches sampled but not yet taken, in step order (waits for those in flight)."""
    return [self._batches[s].result() for s in sorted(self._batches)]

  def close(self) -> None:
    self._thread.shutdown(wait=True, cancel_futures=True)


class InFlightGenerator:
  """PipelineRL as it runs free: generation never waits for an update.

  A host thread samples batch after batch (`sample_batch(index, in_flight)`), each call
  reading the newest published weights every `in_flight_tokens` tokens, so one rollout
  may span several versions; finished batches queue for the learner, at most
  `max_staleness` of them (the thread waits only when the queue is full). `take`
  returns the next batch whose every rollout was begun by a version at most k updates
  old, dropping (and counting, in `Generated.dropped`) the batches before it that are
  older; `consumed(generated)` is called for each batch taken or dropped, on the
  learner's thread. The batches a run trains depend on timing: not reproducible. On
  resume nothing queued is restored: sampling restarts from the restored weights at
  the batch after the last one consumed, so no rollout is counted twice.
  """

  def __init__(self, sample_batch: Callable[[int, rollout.InFlight], Generated], *,
               max_staleness: int, first_batch: int, in_flight_tokens: int,
               consumed: Callable[[Generated], None] = lambda generated: None,
               snapshot: Callable[[Any], Any] | None = None):
    self._sample_batch, self._k, self._consumed = sample_batch, max_staleness, consumed
    self._snapshot = snapshot or (lambda params: jax.tree.map(jnp.copy, params))
    self._in_flight = rollout.InFlight(self._weights, in_flight_tokens)
    self._next = first_batch
    self._latest: tuple[int, Any] | None = None
    self._lock = threading.Lock()
    self._queue: queue.Queue = queue.Queue(maxsize=max_staleness)
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._error: BaseException | None = None

  def _weights(self) -> tuple[int, Any]:
    with self._lock:
      return self._latest

  def publish(self, version: int, params: Any) -> None:
    """The learner's newest weights; the generator switches to them at its next segment."""
    snapshot = self._snapshot(params)
    with self._lock:
      self._latest = (version, snapshot)
    if self._thread is None:
      self._thread = threading.Thread(target=self._run, name="isojax-generator", daemon=True)
      self._thread.start()

  def _run(self) -> None:
    try:
      while not self._stop.is_set():
        generated = self._sample_batch(self._next, self._in_flight)
        self._next += 1
        while not self._stop.is_set():
          try:
            self._queue.put(generated, timeout=0.1)
            break
          except queue.Full:
            continue
    except BaseException as e:  # pylint: disable=broad-except  # re-raised by take()
      self._error = e

  def take(self, learner_version: int) -> tuple[Generated, float]:
    """The next batch at most k updates stale, and the seconds waited for it."""
    start, dropped = time.perf_counter(), 0
    while True:
      try:
        generated = self._queue.get(timeout=0.1)
      except queue.Empty:
        if self._error is not None:
          raise RuntimeError("the generator thread failed") from self._error
        continue
      self._consumed(generated)
      if learner_version - generated.oldest_B().min() <= self._k:
        return dataclasses.replace(generated, dropped=dropped), time.perf_counter() - start
      dropped += generated.scored.rewards_GN.size

  def queued(self) -> list[Generated]:
    """Nothing queued is saved in flight: a resumed run samples afresh (see above)."""
    return []

  def unconsumed_rollouts(self) -> int:
    """The rollouts of finished batches waiting for the learner: what a stop now
    discards (besides the batch being generated)."""
    with self._queue.mutex:
      return sum(g.scored.rewards_GN.size for g in self._queue.queue)

  def close(self) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()


def weight_snapshot(cast: str | None = None, place: Callable[[Any], Any] | None = None
                    ) -> Callable[[Any], Any]:
  """How a generator copies the learner's weights at each version (the update donates
  them): cast to the sampler's dtype once (`cast`, "bfloat16": half the bytes, and no
  sampler call casts them again), else copied as they are; then `place`d (e.g.
  `sharding.on_mesh` onto the generator's own devices)."""
  if cast in (None, "float32"):
    copy = lambda params: jax.tree.map(jnp.copy, params)
  else:
    copy = lambda params: sampler.cast_floats(params, cast)
  return copy if place is None else lambda params: place(copy(params))


def queue_tree(batches: list[Generated]) -> dict[str, Any]:
  """The checkpoint item of the queued batches (`restore_queue` reads it back)."""
  return {f"step_{g.step}": g.to_tree() for g in batches}


def restore_queue(tree: dict[str, Any] | None) -> list[Generated]:
  return sorted((Generated.from_tree(v) for v in (tree or {}).values()), key=lambda g: g.step)
