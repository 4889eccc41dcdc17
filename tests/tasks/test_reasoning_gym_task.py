"""The reasoning-gym task family: splits, grading, validation and the demo's SFT targets."""

from __future__ import annotations

import dataclasses
import json
import re

import ml_collections
import numpy as np
import pytest

from isojax import tasks
from isojax.tasks import reasoning_gym_task as rgt


def _task(dataset=rgt.DEMO_DATASET, kwargs=None, **overrides):
  kwargs = rgt.DEMO_KWARGS if kwargs is None and dataset == rgt.DEMO_DATASET else kwargs
  fields = dict(name="reasoning_gym", dataset=dataset, dataset_kwargs=dict(kwargs or {}),
                answer_pattern="", num_train=48, num_val=16, seed=7)
  fields.update(overrides)
  return tasks.TaskSettings(**fields)


# A numeric family (the demo), string families (one graded with metadata), and ARC,
# whose tuple-valued metadata JSON cannot keep.
GRADED = [(rgt.DEMO_DATASET, None), ("spell_backward", {}), ("word_sorting", {}),
          ("arc_agi", {})]


@pytest.fixture(scope="module")
def demo_splits():
  return rgt.load(_task())


def test_splits_have_exact_sizes_and_are_disjoint(demo_splits):
  train, val = demo_splits.train, demo_splits.val
  assert (len(train), len(val)) == (48, 16)
  train_q, val_q = [p.prompt for p in train], [p.prompt for p in val]
  assert len(set(train_q)) == 48 and len(set(val_q)) == 16
  assert not set(train_q) & set(val_q)


def test_splits_are_deterministic_in_the_seed(demo_splits):
  assert rgt.load(_task()) == demo_splits
  other = rgt.load(_task(seed=8))
  assert [p.prompt for p in other.train] != [p.prompt for p in demo_splits.train]
  assert [p.prompt for p in other.val] != [p.prompt for p in demo_splits.val]


def test_train_drops_questions_that_are_in_val():
  # One-digit two-term sums: 200 distinct questions, so the splits' streams collide
  # often; train must skip val's questions and still fill exactly.
  kwargs = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)
  data = rgt.load(_task(kwargs=kwargs, num_train=120, num_val=40))
  train, val = data.train, data.val
  assert len(train) == 120 and len(val) == 40
  assert len({p.prompt for p in train} | {p.prompt for p in val}) == 160


def test_too_many_problems_for_the_space_names_the_field():
  kwargs = dict(min_terms=2, max_terms=2, min_digits=1, max_digits=1)
  with pytest.raises(ValueError, match=r"task\.num_train=300"):
    rgt.load(_task(kwargs=kwargs, num_train=300, num_val=10))


def test_problem_fields_come_from_the_entry(demo_splits):
  for p in demo_splits.train:
    entry = json.loads(p.meta)
    assert entry["question"] == p.prompt and entry["answer"] == p.answer
    meta = entry["metadata"]
    assert p.difficulty == meta["num_terms"] * meta["num_digits"]
    source = entry[rgt.SOURCE_KEY]
    assert source["seed"] == rgt.split_seed(7, "train") != rgt.split_seed(7, "val")


@pytest.mark.parametrize("dataset,kwargs", GRADED)
def test_verifier_scores_gold_one_and_wrong_zero(dataset, kwargs):
  task = _task(dataset, kwargs, num_train=4, num_val=2)
  train = rgt.load(task).train
  verifier = rgt.make_verifier(task)
  gold = [f"some work\n<answer>\n{p.answer}\n</answer>" for p in train]
  grades = verifier.grade(gold, train)
  assert grades.rewards.tolist() == [1.0] * 4 and grades.errors == 0
  bad = ["<answer>@@@</answer>",                      # wrong and not containing the gold
         train[1].answer,                              # right text but no tags
         f"<answer>{train[2].answer}",                 # unclosed tag
         "\x00\ufffd garbage <answer></answer>"]       # empty answer
  grades = verifier.grade(bad, train)
  assert grades.rewards.tolist() == [0.0] * 4 and grades.errors == 0


def test_last_answer_counts(demo_splits):
  p = demo_splits.train[0]
  verifier = rgt.make_verifier(_task())
  wrong = "@@@"  # not a number containing the gold, which chain_sum gives partial credit
  assert verifier.reward(f"<answer>{wrong}</answer> no: <answer>{p.answer}</answer>", p) == 1
  assert verifier.reward(f"<answer>{p.answer}</answer> no: <answer>{wrong}</answer>", p) == 0


def test_custom_answer_pattern(demo_splits):
  p = demo_splits.train[0]
  verifier = rgt.make_verifier(_task(answer_pattern=r"ANSWER:\s*(\S+)"))
  assert verifier.grade([f"ANSWER: {p.answer}", f"<answer>{p.answer}</answer>"],
                        [p, p]).rewards.tolist() == [1.0, 0.0]


def test_bad_meta_is_an_error_not_a_crash(demo_splits):
  p = demo_splits.train[0]
  broken = dataclasses.replace(p, meta="{not json")
  grades = rgt.make_verifier(_task()).grade([f"<answer>{p.answer}</answer>"] * 2, [broken, p])
  assert grades.rewards.tolist() == [0.0, 1.0] and grades.errors == 1


def test_verifier_rejects_mismatched_lengths(demo_splits):
  with pytest.raises(ValueError, match="2 completions for 1 problems"):
    rgt.make_verifier(_task()).grade(["a", "b"], demo_splits.train[:1])


@pytest.mark.parametrize("dataset,kwargs", GRADED)
def test_meta_round_trip_rebuilds_the_entry(dataset, kwargs):
  import reasoning_gym  # pylint: disable=import-outside-toplevel
  task = _task(dataset, kwargs, num_train=3, num_val=1)
  train = rgt.load(task).train
  verifier = rgt.make_verifier(task)
  fresh = reasoning_gym.create_dataset(dataset, seed=rgt.split_seed(7, "train"),
                                       size=rgt._draw_budget(3), **(rgt.DEMO_KWARGS if kwargs is None else kwargs))
  for p in train:
    entry = verifier.entry(p)
    original = fresh[json.loads(p.meta)[rgt.SOURCE_KEY]["index"]]
    assert entry["question"] == original["question"] == p.prompt
    assert rgt.SOURCE_KEY not in entry
    for answer in (p.answer, "@@@", p.answer[::-1] + "x"):
      assert (fresh.score_answer(answer, entry) == fresh.score_answer(answer, original))


def test_sft_targets_are_correct_worked_sums(demo_splits):
  train, val = demo_splits.train, demo_splits.val
  problems = train + val
  verifier = rgt.make_verifier(_task())
  targets = [rgt.sft_target(p) for p in problems]
  assert verifier.grade(targets, problems).rewards.tolist() == [1.0] * len(problems)
  for p, target in zip(problems, targets):
    # Independent reference: evaluate the question's expression left to right.
    expression = re.search(r": (.*) =$", p.prompt).group(1)
    assert eval(expression) == int(p.answer)  # pylint: disable=eval-used
    steps, tail = target.split(" <answer>")
    assert tail == f"{p.answer}</answer>"
    terms = expression.split()
    assert len(steps.split(", ")) == len(terms) // 2
    total = int(terms[0])
    for step, op, term in zip(steps.split(", "), terms[1::2], terms[2::2]):
      lhs, rhs = step.split("=")
      assert lhs == f"{total}{op}{term}"
      assert int(rhs) == eval(lhs)  # pylint: disable=eval-used
      total = int(rhs)
    assert total == int(p.answer)


def test_sft_target_is_the_bare_answer_elsewhere():
  train = rgt.load(_task("spell_backward", {}, num_train=2, num_val=1)).train
  assert rgt.sft_target(train[0]) == f"<answer>{train[0].answer}</answer>"


def test_demo_prompts_are_short(demo_splits):
  for p in demo_splits.train:
    assert len(p.prompt) < 90 and len(rgt.sft_target(p)) < 60


def test_validate_accepts_the_demo():
  rgt.validate(_task())


@pytest.mark.parametrize("overrides,message", [
    (dict(dataset="chain_sums"), r"task\.dataset='chain_sums'.*chain_sum.*DATASETS"),
    (dict(dataset=""), r"task\.dataset is empty"),
    (dict(dataset_kwargs=ml_collections.ConfigDict(dict(max_termz=3))),
     r"task\.dataset_kwargs\.max_termz.*min_terms"),
    (dict(dataset_kwargs=ml_collections.ConfigDict(dict(seed=3))), r"task\.dataset_kwargs\.seed"),
    (dict(dataset_kwargs=ml_collections.ConfigDict(dict(min_terms=5, max_terms=2))),
     r"task\.dataset_kwargs=.*max_terms must be >= min_terms"),
    (dict(num_train=0), r"task\.num_train=0"),
    (dict(num_val=-1), r"task\.num_val=-1"),
    (dict(answer_pattern="<answer>.*</answer>"), r"task\.answer_pattern.*capture group"),
    (dict(answer_pattern="(unclosed"), r"task\.answer_pattern.*not a regex"),
])
def test_validate_names_the_bad_field(overrides, message):
  fields = dict(dataset=rgt.DEMO_DATASET, dataset_kwargs=ml_collections.ConfigDict(),
                answer_pattern="", num_train=4, num_val=2, seed=0)
  fields.update(overrides)
  with pytest.raises(ValueError, match=message):
    rgt.validate(ml_collections.ConfigDict(fields))


def test_binary_reward_pays_only_full_marks():
  """chain_sum gives partial credit when the gold is a substring of the answer."""
  from isojax.tasks.problem import Problem
  entry = {"question": "q", "answer": "5", "metadata": {}}
  problem = Problem("q", "5", meta=json.dumps(entry))
  scorer = rgt.ReasoningGymVerifier("chain_sum", {}, r"<answer>(.*?)</answer>")
  binary = rgt.ReasoningGymVerifier("chain_sum", {}, r"<answer>(.*?)</answer>",
                                                   binary=True)
  texts = ["<answer>5</answer>", "<answer>15</answer>", "<answer>7</answer>"]
  partial = scorer.grade(texts, [problem] * 3).rewards
  assert partial[0] == 1 and 0 < partial[1] < 1  # the library's own partial credit
  np.testing.assert_array_equal(binary.grade(texts, [problem] * 3).rewards, [1, 0, 0])
