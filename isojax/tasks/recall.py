"""Recall: problems that share nothing, with pass rates set by construction.

The study's testbed for the paper's mechanisms (coverage of hard problems, sharpening of
easy ones). On arithmetic, training on some sums raises the pass rate of others
(transfer), so how often one problem is solved matters less than the paper's setting
assumes. Here nothing transfers:

  problem i      prompt "k<i>" (one key token), answer "a<j>" (one of `recall_answers`
                 answer tokens, drawn per key from `seed`), then EOS;
  level          key i has level 1 + i // recall_keys_per_level, in 1..recall_levels;
                 the base model (`recall_base`) answers it correctly with probability
                 2**-level at temperature 1: a difficulty spread set by construction;
  verifier       exact match of the decoded completion with the answer.

The base model is a table in transformer form: each key's next-token distribution is
its own row of parameters, and the transformer block is exactly zero, a fixed point of
gradient descent. With the embedding frozen (configs/recall.py), training one key moves
no other key's logits (`recall_base`).

Because nothing transfers, held-out keys would stay at their base pass rates whatever
RL does. The validation problems are therefore the first `num_val` training problems:
evaluation measures how many of the trained problems RL has discovered (coverage) and
made reliable (sharpening), which is what the paper's claims are about.
"""

from __future__ import annotations

import numpy as np

from isojax.tasks import problem as problem_lib
from isojax.tasks.settings import TaskSettings

KEY_PREFIX, ANSWER_PREFIX = "k", "a"
DEFAULT_INSTRUCTION = ""  # the prompt is the key token alone
# The settings that decide which problems exist and what the base model answers: a
# base model is built for one value of each (`demo_bases.check_task`).
MODEL_FIELDS = ("seed", "recall_keys_per_level", "recall_levels", "recall_answers")


def num_keys(task: TaskSettings) -> int:
  return task.recall_keys_per_level * task.recall_levels


def answers_of_keys(task: TaskSettings) -> np.ndarray:
  """[num_keys] int: the answer index of every key, deterministic in `task.seed`."""
  rng = np.random.default_rng([task.seed, 0xEC])
  return rng.integers(0, task.recall_answers, num_keys(task))


def level_of_key(task: TaskSettings, key: int) -> int:
  return 1 + key // task.recall_keys_per_level


def all_problems(task: TaskSettings) -> list[problem_lib.Problem]:
  """Every key's problem, in key order; `difficulty` is its level."""
  return [problem_lib.Problem(prompt=f"{KEY_PREFIX}{i}", answer=f"{ANSWER_PREFIX}{a}",
                              difficulty=level_of_key(task, i))
          for i, a in enumerate(answers_of_keys(task))]


def base_pass_rate(level: int) -> float:
  """The base model's probability of the right answer at temperature 1."""
  return 2.0 ** -level


def reward(completion: str, problem: problem_lib.Problem) -> float:
  """1.0 iff the completion is exactly the answer token; 0.0 for anything else."""
  return float(completion.strip() == problem.answer)


def _positive_ints(task: TaskSettings, fields) -> None:
  for field in fields:
    value = getattr(task, field)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
      raise ValueError(f"task.{field}={value!r}: expected a positive integer")


def validate_model_fields(task: TaskSettings) -> None:
  """The fields a base model is built from (`MODEL_FIELDS`)."""
  _positive_ints(task, ("recall_keys_per_level", "recall_levels", "recall_answers"))
  if task.recall_answers < 2:
    raise ValueError(f"task.recall_answers={task.recall_answers}: expected at least 2 "
                     "(one right answer and a wrong one)")


def validate(task: TaskSettings) -> None:
  validate_model_fields(task)
  _positive_ints(task, ("num_train", "num_val", "recall_min_level", "recall_max_level"))
  if not 1 <= task.recall_min_level <= task.recall_max_level <= task.recall_levels:
    raise ValueError(f"task.recall_min_level={task.recall_min_level}, task.recall_max_level="
                     f"{task.recall_max_level}: expected 1 <= min <= max <= "
                     f"task.recall_levels={task.recall_levels}")
  if task.num_val > task.num_train:
    raise ValueError(f"task.num_val={task.num_val} > task.num_train={task.num_train}: the "
                     "recall task evaluates on its training problems (nothing transfers to "
                     "held-out keys), so num_val must be at most num_train")


def load(task: TaskSettings) -> problem_lib.TaskData:
  """Training problems: the keys of levels [recall_min_level, recall_max_level] in an
  order fixed by `seed`, at most `num_train`; validation: the first `num_val` of them."""
  validate(task)
  chosen = [p for p in all_problems(task)
            if task.recall_min_level <= p.difficulty <= task.recall_max_level]
  order = np.random.default_rng([task.seed, 0x0DE]).permutation(len(chosen))
  train = [chosen[i] for i in order[:task.num_train]]
  if len(train) < task.num_train:
    raise ValueError(
        f"task.num_train={task.num_train}: levels {task.recall_min_level} to "
        f"{task.recall_max_level} hold only {len(chosen)} keys "
        f"(task.recall_keys_per_level={task.recall_keys_per_level} per level)")
  return problem_lib.TaskData(train, train[:task.num_val])


def make_verifier(task: TaskSettings) -> problem_lib.Verifier:
  del task  # exact match needs no settings
  return problem_lib.PerItemVerifier(reward)
