"""DAPO's dynamic sampling: sample groups in rounds until B_p of them carry a signal.

A group whose training rewards are all equal has advantage 0 for every rollout and
adds nothing to the policy gradient; zero-variance filtering leaves it out, which
shrinks the batch. Dynamic sampling (`rl.dynamic_sampling`) instead keeps sampling:
round 0 is the step's usual B_p problems, each further round another B_p (same shapes,
so no recompilation), until B_p groups with non-zero reward variance are collected or
`rl.dynamic_sampling_max_rounds` rounds have run. The first B_p such groups, in round
order, are trained on; if the cap is reached first the batch is filled with
zero-variance groups, which the update leaves out of every loss term (so the step
trains on what there is; `train/zero_variance_fraction` is the filled share). Every
generated rollout counts in the run's compute (`rollouts`), kept or not.

The problems of round r >= 1 are a function of (seed, step, r) (`extra_problems`), and
their random key `fold_in(key of the step, r)`, so a run stays reproducible and
resumes exactly.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from isojax.rl import rollout
from isojax.sampling import sampler


@dataclasses.dataclass
class Collected:
  """The groups a step trains on and what it took to find them."""
  chosen: np.ndarray               # [G] int, training-problem ids of the kept groups (G = B_p,
                                   # or fewer under per-problem allocation)
  scored: rollout.ScoredRollouts   # their rollouts: B_p * n, or at most that
  generated_rollouts: int          # every rollout sampled for the step, all rounds
  rounds: int                      # sampling rounds run (1: the first round sufficed)


def extra_problems(seed: int, step: int, round_index: int, num_problems: int,
                   batch: int) -> np.ndarray:
  """The B_p distinct problem ids of round `round_index` >= 1 of update `step`."""
  rng = np.random.default_rng([seed, step, round_index])
  return rng.choice(num_problems, size=batch, replace=num_problems < batch)


def _left_pad_to(x_GP: np.ndarray, length: int, value) -> np.ndarray:
  return np.pad(x_GP, ((0, 0), (length - x_GP.shape[1], 0)), constant_values=value)


def _rows(part: rollout.ScoredRollouts, g: int, n: int) -> slice:
  """Group g's rollouts in `part` (n each, or the part's own group sizes)."""
  if part.group_sizes is None:
    return slice(g * n, (g + 1) * n)
  start = int(part.group_sizes[:g].sum())
  return slice(start, start + int(part.group_sizes[g]))


def take_groups(parts: list[rollout.ScoredRollouts], picks: list[tuple[int, int]], n: int
                ) -> rollout.ScoredRollouts:
  """The groups `picks` = [(part, group)] of the parts as one batch, in that order.

  Prompts are re-padded on the left to the longest part's prompt length (the parts may
  come from different prompt buckets); timings and verifier counts add up over parts.
  Parts of unequal groups (per-problem allocation) keep each group's own rollouts.
  """
  length = max(p.prompt_len for p in parts)
  prompts = [_left_pad_to(p.prompts_GP, length, 0) for p in parts]
  prompt_masks = [_left_pad_to(p.prompt_mask_GP, length, False) for p in parts]
  group_of = lambda arrays: np.stack([arrays[i][g] for i, g in picks])
  rows = lambda i, g: _rows(parts[i], g, n)
  fields = {f.name: np.concatenate([np.asarray(getattr(parts[i].rollouts, f.name))[rows(i, g)]
                                    for i, g in picks])
            for f in dataclasses.fields(sampler.Rollouts)}
  versions = None
  if parts[0].versions_B2 is not None:
    versions = np.concatenate([parts[i].versions_B2[rows(i, g)] for i, g in picks])
  timings: dict[str, float] = {}
  for p in parts:
    for k, v in p.timings.items():
      timings[k] = timings.get(k, 0.0) + v
  sizes = (None if parts[0].group_sizes is None else
           np.asarray([parts[i].group_sizes[g] for i, g in picks]))
  return rollout.ScoredRollouts(
      prompts_GP=group_of(prompts), prompt_mask_GP=group_of(prompt_masks),
      rollouts=sampler.Rollouts(**fields),
      rewards_GN=group_of([p.rewards_GN for p in parts]),
      completions=[c for i, g in picks for c in parts[i].completions[rows(i, g)]],
      verifier_timeouts=sum(p.verifier_timeouts for p in parts),
      verifier_errors=sum(p.verifier_errors for p in parts), timings=timings,
      versions_B2=versions, group_sizes=sizes)


def metrics(generated_rollouts: int, rounds: int) -> dict[str, int]:
  """The step's `train/generated_rollouts` and `train/sampling_rounds`."""
  return {"train/generated_rollouts": int(generated_rollouts),
          "train/sampling_rounds": int(rounds)}


def collect(draw: Callable[[int], tuple[np.ndarray, rollout.ScoredRollouts]], *,
            problems_per_batch: int, max_rounds: int,
            informative: Callable[[rollout.ScoredRollouts], np.ndarray],
            max_rows: int = 0) -> Collected:
  """Rounds of `draw(round) -> (problem ids [G], scored)` until B_p groups are informative.

  `informative(scored)` gives the [G] groups with a learning signal (non-zero variance
  of the training rewards). Stops after the round that completes B_p such groups, or
  after `max_rounds`; then fills with the first uninformative groups, in round order.
  With groups of unequal size (per-problem allocation), `max_rows` > 0 caps the
  rollouts kept: a group is taken, in that order, only while its rollouts fit.
  """
  if max_rounds < 1:
    raise ValueError(f"rl.dynamic_sampling_max_rounds={max_rounds}: expected >= 1")
  parts, ids, kept, spare = [], [], [], []
  generated = 0
  while len(kept) < problems_per_batch and len(parts) < max_rounds:
    chosen, scored = draw(len(parts))
    generated += scored.rewards_B.size
    good_G = np.asarray(informative(scored), bool)
    part = len(parts)
    parts.append(scored)
    ids.append(np.asarray(chosen))
    kept += [(part, g) for g in np.flatnonzero(good_G)]
    spare += [(part, g) for g in np.flatnonzero(~good_G)]
  n = parts[0].rewards_GN.shape[1]
  picks = _fitting(kept + spare, parts, n, problems_per_batch, max_rows)
  return Collected(chosen=np.asarray([ids[i][g] for i, g in picks]),
                   scored=take_groups(parts, picks, n), generated_rollouts=generated,
                   rounds=len(parts))


def _fitting(order: list[tuple[int, int]], parts: list[rollout.ScoredRollouts], n: int,
             problems_per_batch: int, max_rows: int) -> list[tuple[int, int]]:
  """The first B_p groups of `order`; with `max_rows`, only those whose rollouts fit."""
  if not max_rows:
    return order[:problems_per_batch]
  picks, rows = [], 0
  for i, g in order:
    size = _rows(parts[i], g, n)
    if len(picks) < problems_per_batch and rows + size.stop - size.start <= max_rows:
      picks.append((i, g))
      rows += size.stop - size.start
  return picks
