"""Verifiable tasks: problem sets and their 0/1 verifiers."""

from __future__ import annotations

import ml_collections

from isojax.tasks import arithmetic, splits


def load_problems(task: ml_collections.ConfigDict):
  """(train, val) problem lists: a named profiled split, or generated from the knob."""
  if task.name != "arithmetic":
    raise ValueError(f"task.name={task.name!r}: expected 'arithmetic'")
  if task.split:
    return splits.load_split(task.splits_dir, task.split)
  return arithmetic.make_splits(task.seed, task.num_train, task.num_val, task.min_digits,
                                task.max_digits)


def reward_fn(task: ml_collections.ConfigDict):
  del task  # one task family so far
  return arithmetic.reward
