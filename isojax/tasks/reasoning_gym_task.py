"""reasoning-gym datasets as an isojax task family: local, procedural, self-grading.

reasoning-gym generates over a hundred verifiable problem families on the fly from a
seed, and each dataset object grades answers to its own problems (`score_answer`). That
gives isojax real reasoning tasks with nothing to download, graded exactly the way the
dataset's authors grade them. This module turns a `task` config (`dataset`,
`dataset_kwargs`, `seed`, `num_train`, `num_val`, `answer_pattern`) into:

  `validate(task)`       cheap checks that name the bad field, run before any compile;
  `load(task)`           disjoint (train, val) `Problem` lists, deterministic in the seed;
  `make_verifier(task)`  a `Verifier` that extracts `<answer>...</answer>` and scores it
                         with the dataset's own `score_answer`;
  `sft_target(problem)`  the completion the tiny demo base model is supervised on.

Each `Problem.meta` is the reasoning-gym entry as JSON, plus one key (`SOURCE_KEY`) with
the (seed, index, size) that generated it. JSON turns tuples into lists; almost every
dataset grades the same either way, but a few compare tuple-valued metadata (ARC grids),
and for those the verifier regenerates the entry from its source instead.

The demo (`DEMO_DATASET`, `DEMO_KWARGS`) is chain_sum with two or three terms of one or
two digits: short prompts, a one- or two-step computation written out as running sums,
so a 2-layer model after brief SFT on those rationales solves most one-digit problems
and few two-digit ones, and RL has problems of every pass rate in between to learn from.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from typing import Any, Sequence

import numpy as np

from isojax.tasks import problem as problem_lib

DEFAULT_ANSWER_PATTERN = r"<answer>(.*?)</answer>"
DEFAULT_INSTRUCTION = "Give your final answer within <answer> </answer> tags."

# "State the final answer to the following arithmetic problem: 41 - 17 + 90 =". Each
# problem draws one digit count for all its terms, so difficulty (terms x digits: 2, 3,
# 4, 6) comes in four levels. One-digit terms alone (even four of them) are too easy:
# a 1M-parameter 2-layer model solves nearly all of them after brief SFT, leaving RL
# nothing to learn; two-digit sums (carries, three-digit partial sums) keep it busy.
DEMO_DATASET = "chain_sum"
DEMO_KWARGS = dict(min_terms=2, max_terms=3, min_digits=1, max_digits=2)

# The key in `Problem.meta` that records where the entry came from.
SOURCE_KEY = "isojax_source"

# Datasets whose `score_answer` compares metadata that JSON does not keep (tuples of
# tuples become lists of lists, so a correct ARC grid would score 0.05, not 1). Found by
# grading every registered dataset's gold answers against JSON-round-tripped entries.
_JSON_LOSSY = frozenset({"arc_agi", "rearc"})

# `seed` and `size` are set per split by `load`; a config must not set them.
_RESERVED_KWARGS = ("seed", "size")


def _registry() -> dict:
  """reasoning-gym's name -> (dataset class, config class) table (a slow import)."""
  from reasoning_gym import factory  # pylint: disable=import-outside-toplevel
  return factory.DATASETS


def dataset_kwargs(task) -> dict:
  """`task.dataset_kwargs` as a plain dict (it is a ConfigDict in configs)."""
  kwargs = task.dataset_kwargs
  if kwargs is None:
    return {}
  return dict(kwargs.to_dict() if hasattr(kwargs, "to_dict") else kwargs)


def answer_pattern(task) -> str:
  return getattr(task, "answer_pattern", "") or DEFAULT_ANSWER_PATTERN


# ---------------------------------------------------------------------------------
# Validation: every check is cheap and names the field it rejects.
# ---------------------------------------------------------------------------------


def validate(task) -> None:
  """Raises ValueError naming the bad `task.*` field; builds at most a 1-item dataset."""
  name = task.dataset
  registry = _registry()
  if not name:
    raise ValueError(f"task.dataset is empty: expected a reasoning-gym dataset name, "
                     f"e.g. {DEMO_DATASET!r}")
  if name not in registry:
    close = difflib.get_close_matches(name, registry, n=5, cutoff=0.5)
    hint = f"close matches: {', '.join(close)}; " if close else ""
    raise ValueError(
        f"task.dataset={name!r} is not a reasoning-gym dataset ({hint}list all "
        f"{len(registry)} with: python -c \"from reasoning_gym.factory import DATASETS; "
        f"print(sorted(DATASETS))\")")
  kwargs = dataset_kwargs(task)
  config_cls = registry[name][1]
  fields = [f.name for f in dataclasses.fields(config_cls) if f.name not in _RESERVED_KWARGS]
  for key in kwargs:
    if key in _RESERVED_KWARGS:
      raise ValueError(f"task.dataset_kwargs.{key} is set per split from task.seed and "
                       f"task.num_train/num_val; remove it")
    if key not in fields:
      raise ValueError(f"task.dataset_kwargs.{key}: {name!r} ({config_cls.__name__}) has "
                       f"no such field; expected one of {sorted(fields)}")
  try:
    _build(name, kwargs, seed=0, size=1)[0]
  except Exception as e:  # pylint: disable=broad-except  # assertions, TypeErrors, ...
    raise ValueError(f"task.dataset_kwargs={kwargs} rejected by {name!r} "
                     f"({config_cls.__name__}): {type(e).__name__}: {e}") from e
  for field in ("num_train", "num_val"):
    value = getattr(task, field)
    if not isinstance(value, int) or value <= 0:
      raise ValueError(f"task.{field}={value!r}: expected a positive integer")
  pattern = answer_pattern(task)
  try:
    groups = re.compile(pattern).groups
  except re.error as e:
    raise ValueError(f"task.answer_pattern={pattern!r} is not a regex: {e}") from e
  if groups < 1:
    raise ValueError(f"task.answer_pattern={pattern!r}: expected a capture group "
                     f"around the answer, e.g. {DEFAULT_ANSWER_PATTERN!r}")


def _build(name: str, kwargs: dict, *, seed: int, size: int):
  import reasoning_gym  # pylint: disable=import-outside-toplevel
  return reasoning_gym.create_dataset(name, seed=seed, size=size, **kwargs)


# ---------------------------------------------------------------------------------
# Problems: disjoint, deterministic splits.
# ---------------------------------------------------------------------------------


def split_seed(seed: int, split: str) -> int:
  """A 31-bit dataset seed for one split, far from the other split's.

  reasoning-gym seeds item i with `seed + i`, so seeds s and s+1 would give the same
  items shifted by one; hashed seeds keep the two splits' streams apart."""
  digest = hashlib.sha256(f"isojax/reasoning_gym/{seed}/{split}".encode()).digest()
  return int.from_bytes(digest[:4], "big") >> 1


def _draw_budget(count: int) -> int:
  """Items to try for `count` distinct questions before declaring the space too small."""
  return 8 * count + 1024


def difficulty(metadata: dict) -> int:
  """A per-problem difficulty from metadata: the dataset's own integer level if it has
  one, else operand digits to combine (terms x digits) for the arithmetic chains, else 0.
  """
  level = metadata.get("difficulty")
  if isinstance(level, int) and not isinstance(level, bool):
    return level
  terms, digits = metadata.get("num_terms"), metadata.get("num_digits")
  if isinstance(terms, int) and isinstance(digits, int):
    return terms * digits
  return 0


def to_problem(entry: dict, source: dict) -> problem_lib.Problem:
  """A `Problem` whose meta is the entry plus where it came from (see module doc)."""
  answer = entry["answer"]
  # Some datasets (boxnet, rush_hour, ...) accept many answers and have no single gold:
  # their `answer` is None and only `score_answer` can judge.
  return problem_lib.Problem(
      prompt=entry["question"],
      answer="" if answer is None else str(answer),
      difficulty=difficulty(entry.get("metadata") or {}),
      meta=json.dumps({**entry, SOURCE_KEY: source}, default=str))


def _distinct(name: str, kwargs: dict, seed: int, count: int, exclude: frozenset,
              field: str) -> list[problem_lib.Problem]:
  """The first `count` distinct questions not in `exclude` from the dataset at `seed`."""
  size = _draw_budget(count)
  dataset = _build(name, kwargs, seed=seed, size=size)
  seen, problems = set(exclude), []
  for index in range(size):
    if len(problems) == count:
      break
    try:
      entry = dataset[index]
    except IndexError:  # a dataset that ran out of items (word_ladder) shrinks its size
      break
    if entry["question"] in seen:
      continue
    seen.add(entry["question"])
    problems.append(to_problem(entry, dict(seed=seed, index=index, size=size)))
  if len(problems) < count:
    raise ValueError(
        f"task.{field}={count}: {name!r} with task.dataset_kwargs={kwargs} gave only "
        f"{len(problems)} distinct questions (not in the other split) in {size} draws; "
        f"lower task.{field} or widen the dataset's ranges")
  return problems


def load(task) -> problem_lib.TaskData:
  """Exactly num_train and num_val problems, no question in both."""
  name, kwargs = task.dataset, dataset_kwargs(task)
  val = _distinct(name, kwargs, split_seed(task.seed, "val"), task.num_val, frozenset(),
                  "num_val")
  train = _distinct(name, kwargs, split_seed(task.seed, "train"), task.num_train,
                    frozenset(p.prompt for p in val), "num_train")
  return problem_lib.TaskData(train, val)


# ---------------------------------------------------------------------------------
# Grading.
# ---------------------------------------------------------------------------------


def extract_answer(completion: str, pattern: re.Pattern) -> str | None:
  """The last match's first group, stripped; None when nothing matched.

  The last, because a model that reasons before answering may quote the tags earlier."""
  matches = list(pattern.finditer(completion))
  return matches[-1].group(1).strip() if matches else None


class ReasoningGymVerifier(problem_lib.Verifier):
  """Scores completions with the dataset's own `score_answer`, clipped to [0, 1]."""

  def __init__(self, name: str, kwargs: dict, pattern: str, binary: bool = False):
    self.name, self.kwargs, self.binary = name, dict(kwargs), binary
    self.pattern = re.compile(pattern, re.DOTALL)
    # score_answer is a method: some datasets grade with their config (ARC board
    # format), so the scorer is built once with the task's kwargs.
    self.scorer = _build(name, self.kwargs, seed=0, size=1)
    self._generators: dict[tuple[int, int], Any] = {}
    self._regenerated: dict[tuple[int, int], dict] = {}

  def entry(self, problem: problem_lib.Problem) -> dict:
    """The reasoning-gym entry `score_answer` expects, rebuilt from `problem.meta`."""
    entry = json.loads(problem.meta)
    source = entry.pop(SOURCE_KEY, None)
    if self.name not in _JSON_LOSSY or source is None:
      return entry
    key = (source["seed"], source["index"])
    if key not in self._regenerated:
      gen_key = (source["seed"], source["size"])
      if gen_key not in self._generators:
        self._generators[gen_key] = _build(self.name, self.kwargs, seed=gen_key[0],
                                           size=gen_key[1])
      fresh = self._generators[gen_key][source["index"]]
      if fresh["question"] != entry["question"]:
        raise ValueError(f"regenerating {self.name!r} item {key} gave a different question")
      self._regenerated[key] = fresh
    return self._regenerated[key]

  def reward(self, completion: str, problem: problem_lib.Problem) -> float:
    """May raise on malformed meta or a failing scorer; `grade` counts that as an error."""
    answer = extract_answer(completion, self.pattern)
    if not answer:  # empty tags are no answer (ARC would grade "" as an empty grid: 0.05)
      return 0.0
    score = float(self.scorer.score_answer(answer, self.entry(problem)))
    score = min(max(score, 0.0), 1.0) if math.isfinite(score) else 0.0
    # Partial credit (chain_sum gives "15" for gold 5 half a point) can be exploited;
    # `task.binary_reward` pays only full marks, as evaluation counts them.
    return float(score >= 1.0) if self.binary else score

  def grade(self, completions: Sequence[str],
            problems: Sequence[problem_lib.Problem]) -> problem_lib.Grades:
    if len(completions) != len(problems):
      raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    rewards, errors = np.zeros(len(completions), np.float32), 0
    for i, (completion, problem) in enumerate(zip(completions, problems)):
      try:
        rewards[i] = self.reward(completion, problem)
      except Exception:  # pylint: disable=broad-except  # a verifier never crashes a run
        errors += 1
    return problem_lib.Grades(rewards, errors=errors)


def make_verifier(task) -> ReasoningGymVerifier:
  return ReasoningGymVerifier(task.dataset, dataset_kwargs(task), answer_pattern(task),
                              binary=bool(task.binary_reward))


# ---------------------------------------------------------------------------------
# Supervised targets for the tiny demo base model.
# ---------------------------------------------------------------------------------


def _chain_sum_steps(metadata: dict) -> str:
  """Running partial sums of "7 + 2 - 5": "7+2=9, 9-5=4"."""
  parts = metadata["expression"].split()  # reasoning-gym joins terms and signs by spaces
  total, steps = int(parts[0]), []
  for op, term in zip(parts[1::2], parts[2::2]):
    value = int(term)
    new_total = total + value if op == "+" else total - value
    # Parenthesise negative terms (allow_negation) so "5--3" never appears.
    shown = f"({value})" if value < 0 else str(value)
    steps.append(f"{total}{op}{shown}={new_total}")
    total = new_total
  return ", ".join(steps)


# Datasets with a hand-written rationale; every other dataset gets the bare answer.
_RATIONALES = {"chain_sum": _chain_sum_steps}


def sft_target(problem: problem_lib.Problem) -> str:
  """A short worked rationale (where one is written) then `<answer>gold</answer>`."""
  entry = json.loads(problem.meta) if problem.meta else {}
  metadata = entry.get("metadata") or {}
  rationale = _RATIONALES.get(metadata.get("source_dataset"))
  answer = f"<answer>{problem.answer}</answer>"
  return f"{rationale(metadata)} {answer}" if rationale else answer
