"""The arithmetic task: disjoint splits, exact verifier that never raises."""

import pytest
from hypothesis import given, strategies as st

from isojax.tasks import arithmetic

PROBLEM = arithmetic.Problem(prompt="47+85=", answer="132", difficulty=2)


@pytest.mark.parametrize("text,expected", [
    ("132", 1.0), (" 132\n", 1.0), ("133", 0.0), ("", 0.0), ("13 2", 0.0), ("0132", 0.0),
    ("132132", 0.0), ("-132", 0.0), ("١٣٢", 0.0), ("+=", 0.0), ("1e2", 0.0)])
def test_verifier(text, expected):
  assert arithmetic.reward(text, PROBLEM) == expected


@given(st.text())
def test_verifier_never_raises(text):
  assert arithmetic.reward(text, PROBLEM) in (0.0, 1.0)


def test_verifier_survives_non_string():
  assert arithmetic.reward(None, PROBLEM) == 0.0


def test_splits_are_disjoint_deterministic_and_correct():
  train, val = arithmetic.make_splits(7, 300, 50, 1, 3)
  assert len(train) == 300 and len(val) == 50
  assert not {p.prompt for p in train} & {p.prompt for p in val}
  assert [p.prompt for p in arithmetic.make_splits(7, 300, 50, 1, 3)[0]] == [
      p.prompt for p in train]
  for p in train + val:
    a, b = p.prompt[:-1].split("+")
    assert int(p.answer) == int(a) + int(b)
    assert len(a) == len(b) == p.difficulty


def test_too_many_problems_is_an_error():
  with pytest.raises(ValueError, match="num_train"):
    arithmetic.make_splits(0, 100, 10, 1, 1)


def test_small_validation_partition_is_an_error_not_a_hang():
  # One-digit sums: 100 problems, about 1/8 of them in the validation partition.
  with pytest.raises(ValueError, match="task.num_val=30"):
    arithmetic.make_splits(0, 10, 30, 1, 1)
