"""The math loader: every file type x every field mapping, splits, and every bad input.

Files are written here with json / csv / pyarrow / `datasets`, in the shapes the public
sets use, and read back through `math_data.load` with the network blocked; assertions
compare the exact questions and golds, so a wrong column, a wrong split or a
reordering fails.
"""

import csv
import json
import os
import socket

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from isojax.config import config_lib
from isojax.tasks import math_data

DAPO_PREFIX = ("Solve the following math problem step by step. The last line of your "
               "response should be of the form Answer: $Answer (without quotes) where "
               "$Answer is the answer to the problem.\n\n")
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'


def dapo_chat(question, gold):
  """A row of the original DAPO-Math-17k: chat prompt, gold in reward_model."""
  return dict(data_source="math_dapo", ability="MATH",
              prompt=[dict(role="user", content=DAPO_PREFIX + question + DAPO_SUFFIX)],
              reward_model=dict(ground_truth=gold, style="rule-lighteval/MATH_v2"),
              extra_info=dict(index=question[:4]))


# Each case: the task fields it sets, rows (the last one is the validation row), and
# the (question, gold) each row must load as.
CASES = {
    "gsm8k": (dict(format="gsm8k"), [
        dict(question="Natalia sold 48 clips, then half as many. How many in all?",
             answer="48/2 = <<48/2=24>>24\n48+24 = <<48+24=72>>72\n#### 72"),
        dict(question="A farm has 1,234 cows. How many?", answer="It has #### 1,234"),
        dict(question="What is 6 times 7?", answer="6*7=42\n#### 42"),
    ], [("Natalia sold 48 clips, then half as many. How many in all?", "72"),
        ("A farm has 1,234 cows. How many?", "1234"), ("What is 6 times 7?", "42")]),
    "math": (dict(format="math"), [
        dict(problem="Compute $\\sin 30^\\circ$.", solution="It is $\\boxed{\\frac12}$.",
             answer="\\frac{1}{2}", level="Level 1"),
        dict(problem="Find $x$ if $2x=6$.", solution="$x=\\boxed{3}$", answer="3",
             level="Level 1"),
        dict(problem="What is $\\sqrt{18}$?", solution="$\\boxed{3\\sqrt{2}}$",
             answer="3\\sqrt{2}", level="Level 2"),
    ], [("Compute $\\sin 30^\\circ$.", "\\frac{1}{2}"), ("Find $x$ if $2x=6$.", "3"),
        ("What is $\\sqrt{18}$?", "3\\sqrt{2}")]),
    # MATH without an answer column: the gold is the last \boxed{} of the solution.
    "math_boxed": (dict(format="math"), [
        dict(problem="Simplify $\\frac{4}{8}$.",
             solution="First $\\boxed{2}$ is wrong; it is $\\boxed{\\frac{1}{2}}$."),
        dict(problem="Compute $1+1$.", solution="$1+1=\\boxed{2}$."),
        dict(problem="Compute $2^{10}$.", solution="So $\\boxed{1024}$."),
    ], [("Simplify $\\frac{4}{8}$.", "\\frac{1}{2}"), ("Compute $1+1$.", "2"),
        ("Compute $2^{10}$.", "1024")]),
    "dapo_chat": (dict(format="dapo"), [
        dapo_chat("Let $a+b=34$ and $a=b$. Find $2a$.", "34"),
        dapo_chat("How many primes are below 10?", "4"),
        dapo_chat("Find the sum $1+2+\\cdots+10$.", "55"),
    ], [("Let $a+b=34$ and $a=b$. Find $2a$.", "34"),
        ("How many primes are below 10?", "4"), ("Find the sum $1+2+\\cdots+10$.", "55")]),
    # open-r1's processed DAPO: a plain-string prompt and the gold in `solution`.
    "dapo_processed": (dict(format="dapo"), [
        dict(prompt="How many sides has a hexagon?", solution="6", data_source="dapo"),
        dict(prompt="What is $10/4$?", solution="\\frac{5}{2}", data_source="dapo"),
        dict(prompt="Find $3^3$.", solution="27", data_source="dapo"),
    ], [("How many sides has a hexagon?", "6"), ("What is $10/4$?", "\\frac{5}{2}"),
        ("Find $3^3$.", "27")]),
    "polaris": (dict(format="polaris"), [
        dict(problem="Find the area of a unit square.", answer="1", difficulty="1/8"),
        dict(problem="Solve $x^2=4$, $x>0$.", answer="2", difficulty="2/8"),
        dict(problem="What is $\\pi$ to one decimal?", answer="3.1", difficulty="0/8"),
    ], [("Find the area of a unit square.", "1"), ("Solve $x^2=4$, $x>0$.", "2"),
        ("What is $\\pi$ to one decimal?", "3.1")]),
    # DeepScaleR: `answer`, falling back per row to the boxed answer of `solution`.
    "deepscaler": (dict(format="deepscaler"), [
        dict(problem="Compute $5!$.", answer="120", solution="$\\boxed{120}$"),
        dict(problem="Compute $7 \\cdot 8$.", answer="", solution="It is $\\boxed{56}$."),
        dict(problem="Compute $9^2$.", answer="81", solution="$\\boxed{81}$"),
    ], [("Compute $5!$.", "120"), ("Compute $7 \\cdot 8$.", "56"), ("Compute $9^2$.", "81")]),
    "generic": (dict(format="generic", question_field="q", answer_field="gold"), [
        dict(q="What is 2+2?", gold="4", other="x"),
        dict(q="What is 3+3?", gold="6", other="y"),
        dict(q="What is 4+4?", gold="8", other="z"),
    ], [("What is 2+2?", "4"), ("What is 3+3?", "6"), ("What is 4+4?", "8")]),
}

FILE_TYPES = ("jsonl", "json", "parquet", "csv", "disk", "disk_dict")
# A CSV cell cannot hold DAPO's chat list or reward_model struct.
UNREPRESENTABLE = {("dapo_chat", "csv")}


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path_factory):
  """No network (a load that reached for it would fail) and a throwaway HF cache."""
  def refuse(*args, **kwargs):
    raise OSError("the math loader must not use the network")
  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE",
                      str(tmp_path_factory.mktemp("hf_cache")))


def make_task(**fields):
  task = config_lib.base_config().task
  task.num_train, task.num_val, task.seed = 0, 0, 1234
  task.update(fields)
  return task


def write(rows, path_stem, file_type):
  """Writes rows as `file_type`; returns the path to give task.*_files."""
  path = f"{path_stem}.{file_type}"
  if file_type == "jsonl":
    with open(path, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
  elif file_type == "json":
    with open(path, "w") as f:
      json.dump(rows, f)
  elif file_type == "parquet":
    pq.write_table(pa.Table.from_pylist(rows), path)
  elif file_type == "csv":
    with open(path, "w", newline="") as f:
      writer = csv.DictWriter(f, fieldnames=list(rows[0]))
      writer.writeheader()
      writer.writerows(rows)
  elif file_type == "disk":
    datasets.Dataset.from_list(rows).save_to_disk(path)
  else:
    raise ValueError(file_type)
  return path


def pairs(problems):
  return [(p.prompt, p.answer) for p in problems]


@pytest.mark.parametrize("file_type", FILE_TYPES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_mapping_in_every_file_type(tmp_path, case, file_type):
  if (case, file_type) in UNREPRESENTABLE:
    pytest.skip("a CSV cell cannot hold a list of chat messages")
  fields, rows, expected = CASES[case]
  if file_type == "disk_dict":
    path = str(tmp_path / "dd")
    datasets.DatasetDict(train=datasets.Dataset.from_list(rows[:-1]),
                         test=datasets.Dataset.from_list(rows[-1:])).save_to_disk(path)
    task = make_task(train_files=path, val_split="test", **fields)
  else:
    task = make_task(train_files=write(rows[:-1], tmp_path / "train", file_type),
                     val_files=write(rows[-1:], tmp_path / "val", file_type), **fields)
  report = math_data.load(task)
  train, val = report.train, report.val
  assert pairs(train) == expected[:-1]
  assert pairs(val) == expected[-1:]
  assert all(p.difficulty == 0 and p.meta == "" for p in train + val)
  assert (len(train), len(val), report.skipped, report.skipped_rows) == (2, 1, {}, {})


def test_globs_and_comma_lists_read_every_file_in_order(tmp_path):
  rows = [dict(q=f"What is {i}+1?", a=str(i + 1)) for i in range(6)]
  for i in range(3):
    write(rows[2 * i:2 * i + 2], tmp_path / f"part{i}", "jsonl")
  task = make_task(question_field="q", answer_field="a", num_val=1,
                   train_files=f"{tmp_path}/part[01].jsonl, {tmp_path}/part2.jsonl")
  data = math_data.load(task)
  train, val = data.train, data.val
  assert sorted(pairs(train + val)) == sorted((r["q"], r["a"]) for r in rows)


def test_integer_golds_become_text(tmp_path):
  rows = [dict(q="What is 6*7?", a=42), dict(q="What is 0.5*3?", a=1.5)]
  task = make_task(question_field="q", answer_field="a",
                   train_files=write(rows, tmp_path / "t", "parquet"),
                   val_files=write(rows[:1], tmp_path / "v", "jsonl"))
  report = math_data.load(task)
  train, val = report.train, report.val
  assert pairs(val) == [("What is 6*7?", "42")]
  assert pairs(train) == [("What is 0.5*3?", "1.5")]  # its twin is in val
  assert report.skipped == {"train/in_val": 1}


def test_csv_cells_are_read_as_text(tmp_path):
  # Left to pandas, "0.50" would load as 0.5 and "12" beside an empty cell as "12.0".
  rows = [dict(q="A?", a="0.50"), dict(q="B?", a=""), dict(q="C?", a="12")]
  task = make_task(question_field="q", answer_field="a", num_val=1,
                   train_files=write(rows, tmp_path / "t", "csv"))
  report = math_data.load(task)
  train, val = report.train, report.val
  assert sorted(pairs(train + val)) == [("A?", "0.50"), ("C?", "12")]
  assert report.skipped == {"train/missing_answer": 1}


def test_field_override_keeps_the_formats_reading(tmp_path):
  rows = [dict(query="Q1", worked="so #### 1,000"), dict(query="Q2", worked="#### 7")]
  task = make_task(format="gsm8k", question_field="query", answer_field="worked",
                   num_val=1, train_files=write(rows, tmp_path / "t", "jsonl"))
  data = math_data.load(task)
  train, val = data.train, data.val
  assert sorted(pairs(train + val)) == [("Q1", "1000"), ("Q2", "7")]


# ------------------------------------------------------------------------- splits


def generic_file(tmp_path, n, duplicates=0):
  rows = [dict(q=f"What is {i}*3?", a=str(3 * i)) for i in range(n)]
  rows += rows[:duplicates]  # exact repeats, as DAPO-Math-17k has
  return write(rows, tmp_path / "pool", "jsonl")


def test_held_out_split_is_deterministic_disjoint_and_sized(tmp_path):
  path = generic_file(tmp_path, 40, duplicates=10)
  load = lambda seed, n_val: math_data.load(make_task(
      question_field="q", answer_field="a", train_files=path, num_val=n_val, seed=seed))
  report = load(1, 7)
  train, val = report.train, report.val
  assert (len(train), len(val)) == (33, 7)
  assert report.skipped == {"train/duplicate_question": 10}
  questions = [p.prompt for p in train + val]
  assert len(set(questions)) == 40 and not {p.prompt for p in train} & {p.prompt for p in val}
  assert pairs(load(1, 7).val) == pairs(val) and pairs(load(1, 7).train) == pairs(train)
  assert pairs(load(2, 7).val) != pairs(val)
  # A larger hold-out keeps the smaller one's problems.
  assert set(pairs(val)) < set(pairs(load(1, 12).val))
  # Every problem kept its own gold through the split.
  assert all(int(p.answer) == 3 * int(p.prompt.split()[2].split("*")[0]) for p in train + val)


def test_num_train_caps_with_a_seeded_subset(tmp_path):
  path = generic_file(tmp_path, 40)
  load = lambda n_train, seed=1: math_data.load(make_task(
      question_field="q", answer_field="a", train_files=path, num_val=5,
      num_train=n_train, seed=seed))
  full = load(0)
  full_train, full_val = full.train, full.val
  report = load(10)
  train10, val10 = report.train, report.val
  assert len(full_train) == 35 and len(train10) == 10 and len(report.train) == 10
  assert pairs(val10) == pairs(full_val)  # the cap never moves validation problems
  assert set(pairs(train10)) < set(pairs(full_train))
  assert pairs(load(10).train) == pairs(train10)
  assert set(pairs(train10)) < set(pairs(load(20).train))
  assert pairs(load(10, seed=2).train) != pairs(train10)
  assert len(load(1000).train) == 35  # a cap above the set's size takes everything


def test_num_val_caps_a_separate_validation_source(tmp_path):
  task = make_task(question_field="q", answer_field="a", num_val=4,
                   train_files=generic_file(tmp_path, 3),
                   val_files=write([dict(q=f"V{i}", a=str(i)) for i in range(10)],
                                   tmp_path / "v", "csv"))
  data = math_data.load(task)
  train, val = data.train, data.val
  assert len(train) == 3 and len(val) == 4 and {p.prompt for p in val} < {
      f"V{i}" for i in range(10)}


# --------------------------------------------------------------------- bad input


def test_bad_rows_are_skipped_and_counted(tmp_path):
  rows = [dict(q="Good one?", a="1"), dict(q=None, a="2"), dict(q="   ", a="3"),
          dict(q="No answer?", a=None), dict(q="Empty answer?", a=""),
          dict(q="Unparseable?", a="???"), dict(q="Good one?", a="1"),
          dict(q="Good two?", a="\\frac{1}{3}")]
  task = make_task(question_field="q", answer_field="a", num_val=1, seed=0,
                   train_files=write(rows, tmp_path / "t", "jsonl"))
  report = math_data.load(task)
  train, val = report.train, report.val
  assert sorted(pairs(train + val)) == [("Good one?", "1"), ("Good two?", "\\frac{1}{3}")]
  assert report.skipped == {"train/missing_question": 2, "train/missing_answer": 2,
                            "train/unparseable_answer": 1, "train/duplicate_question": 1}
  path = tmp_path / "t.jsonl"
  assert report.skipped_rows == {"train/missing_question": [f"{path} row 2", f"{path} row 3"],
                                 "train/missing_answer": [f"{path} row 4", f"{path} row 5"],
                                 "train/unparseable_answer": [f"{path} row 6"],
                                 "train/duplicate_question": [f"{path} row 7"]}


def test_only_the_first_skipped_rows_are_named_and_the_log_says_how_many(tmp_path, caplog):
  rows = [dict(q=f"Q{i}?", a="") for i in range(8)] + [dict(q="Fine?", a="2"),
                                                       dict(q="Good?", a="3")]
  task = make_task(question_field="q", answer_field="a", num_val=1,
                   train_files=write(rows, tmp_path / "t", "jsonl"))
  with caplog.at_level("INFO", logger="absl"):  # absl's logger keeps its own level
    report = math_data.load(task)
  path = tmp_path / "t.jsonl"
  assert report.skipped_rows["train/missing_answer"] == [f"{path} row {i}" for i in range(1, 6)]
  assert report.skipped["train/missing_answer"] == 8
  assert (f"skipped 8 row(s) for train/missing_answer: {path} row 1, {path} row 2, "
          f"{path} row 3, {path} row 4, {path} row 5 and 3 more") in caplog.text
  # One file and no validation source: the split it made is logged.
  assert (f"held out task.num_val=1 of the 2 usable problems of {path} as validation"
          in caplog.text)


@pytest.mark.parametrize("file_type", ["jsonl", "parquet"])
def test_a_list_valued_answer_takes_its_one_element(tmp_path, file_type):
  """OlympiadBench's `final_answer: ["2"]`: one element is the answer; none is missing."""
  rows = [dict(q="One?", a=["2"]), dict(q="Half?", a=["\\frac{1}{2}"]), dict(q="None?", a=[])]
  task = make_task(question_field="q", answer_field="a", num_val=1,
                   train_files=write(rows, tmp_path / "t", file_type))
  report = math_data.load(task)
  train, val = report.train, report.val
  assert sorted(pairs(train + val)) == [("Half?", "\\frac{1}{2}"), ("One?", "2")]
  assert report.skipped == {"train/missing_answer": 1}


def test_a_list_with_several_answers_is_an_error_naming_the_row(tmp_path):
  rows = [dict(q="One?", a=["2"]), dict(q="Two?", a=["2", "3"])]
  task = make_task(question_field="q", answer_field="a", num_val=1,
                   train_files=write(rows, tmp_path / "t", "jsonl"))
  with pytest.raises(ValueError, match=r"t\.jsonl row 2: column 'a' holds 2 values "
                     r"\['2', '3'\]; expected one"):
    math_data.load(task)


def test_a_gsm8k_answer_without_the_marker_is_skipped(tmp_path):
  rows = [dict(question="A?", answer="#### 3"), dict(question="B?", answer="just 4"),
          dict(question="C?", answer="#### 5")]
  task = make_task(format="gsm8k", num_val=1, train_files=write(rows, tmp_path / "t", "csv"))
  report = math_data.load(task)
  train, val = report.train, report.val
  assert sorted(pairs(train + val)) == [("A?", "3"), ("C?", "5")]
  assert report.skipped == {"train/missing_answer": 1}


def test_a_file_with_no_usable_row_raises_naming_it(tmp_path):
  path = write([dict(q="A?", a="???"), dict(q="B?", a="")], tmp_path / "bad", "jsonl")
  task = make_task(question_field="q", answer_field="a", train_files=path, num_val=1)
  with pytest.raises(ValueError, match=r"bad\.jsonl: no usable train problems.*"
                     r"unparseable_answer': 1"):
    math_data.load(task)


@pytest.mark.parametrize("field", ["train_files", "val_files"])
def test_missing_file_names_path_and_field(tmp_path, field):
  good = generic_file(tmp_path, 5)
  fields = dict(train_files=good, val_files=good)
  fields[field] = str(tmp_path / "nope.jsonl")
  with pytest.raises(FileNotFoundError, match=rf"task\.{field}: .*nope\.jsonl does not exist"):
    math_data.load(make_task(question_field="q", answer_field="a", **fields))


def test_glob_matching_nothing(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"task\.train_files: .*\*\.parquet.* no files"):
    math_data.load(make_task(question_field="q", answer_field="a",
                             train_files=str(tmp_path / "*.parquet")))


def test_unknown_format_lists_the_known_ones():
  task = make_task(format="aime", train_files="x.jsonl")
  for fn in (math_data.validate, math_data.load):
    with pytest.raises(ValueError, match=r"task\.format='aime'.*'dapo'.*'gsm8k'.*'polaris'"):
      fn(task)


@pytest.mark.parametrize("fields,match", [
    (dict(format="gsm8k"), r"t\.jsonl: task\.format='gsm8k' reads the question from column "
     r"'question' \(override with task\.question_field\), but the file has columns "
     r"\['q', 'a'\]"),
    (dict(question_field="q", answer_field="gold"),
     r"t\.jsonl: .*reads the answer from column 'gold'.*columns \['q', 'a'\]"),
    (dict(format="math", question_field="q"),
     r"reads the answer from column 'answer' or 'solution'"),
])
def test_a_missing_column_names_file_field_and_columns(tmp_path, fields, match):
  path = write([dict(q="A?", a="1")], tmp_path / "t", "jsonl")
  with pytest.raises(ValueError, match=match):
    math_data.load(make_task(train_files=path, **fields))


@pytest.mark.parametrize("fields,match", [
    (dict(format="math"), r"exactly one training source"),
    (dict(format="math", train_files="a.jsonl", tfds_name="gsm8k", data_dir="/d"),
     r"exactly one training source"),
    (dict(format="gsm8k", tfds_name="gsm8k"), r"needs task\.data_dir"),
    (dict(train_files="a.jsonl", format="generic", question_field="q"),
     r"needs both task\.question_field and task\.answer_field"),
    (dict(train_files="a.jsonl", format="polaris", num_train=-1), r"task\.num_train=-1"),
])
def test_validate_rejects_bad_fields_without_reading(fields, match):
  task = make_task(**fields)
  with pytest.raises(ValueError, match=match):
    math_data.validate(task)


def test_validate_does_not_touch_the_files():
  math_data.validate(make_task(format="math", train_files="/does/not/exist.jsonl"))


def test_mixed_and_unknown_extensions_name_the_file(tmp_path):
  a = write([dict(q="A?", a="1")], tmp_path / "a", "jsonl")
  b = write([dict(q="B?", a="2")], tmp_path / "b", "csv")
  txt = tmp_path / "c.txt"
  txt.write_text("q,a\n")
  task = make_task(question_field="q", answer_field="a", num_val=1, train_files=f"{a},{b}")
  with pytest.raises(ValueError, match=r"task\.train_files: mixed file types .*a\.jsonl.*b\.csv"):
    math_data.load(task)
  task.train_files = str(txt)
  with pytest.raises(ValueError, match=r"c\.txt has extension '\.txt'; expected one of"):
    math_data.load(task)


def test_bad_directories_and_splits(tmp_path):
  plain = tmp_path / "plain_dir"
  plain.mkdir()
  task = make_task(question_field="q", answer_field="a", train_files=str(plain))
  with pytest.raises(ValueError, match=r"plain_dir is a directory but not one written by"):
    math_data.load(task)
  dd = str(tmp_path / "dd")
  datasets.DatasetDict(train=datasets.Dataset.from_list([dict(q="A?", a="1")])
                       ).save_to_disk(dd)
  task.train_files, task.val_split = dd, "validation"
  with pytest.raises(ValueError, match=r"task\.val_split='validation': .*dd holds splits "
                     r"\['train'\]"):
    math_data.load(task)
  task.train_files = generic_file(tmp_path, 5)
  with pytest.raises(ValueError, match=r"task\.val_split='validation' needs a DatasetDict"):
    math_data.load(task)


def test_holding_out_everything_is_an_error(tmp_path):
  task = make_task(question_field="q", answer_field="a", num_val=5,
                   train_files=generic_file(tmp_path, 5))
  with pytest.raises(ValueError, match=r"task\.num_val=5: only 5 usable problems"):
    math_data.load(task)


# -------------------------------------------------------------------------- TFDS


def prepare_tfds(data_dir):
  """A tiny GSM8K-shaped TFDS dataset in array_record format, built without TensorFlow.

  Defined unregistered, so `load` must find it from the prepared files alone, as it
  would a dataset prepared on another machine.
  """
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  with tfds.core.registered.skip_registration():
    class TinyGsm(tfds.core.GeneratorBasedBuilder):
      VERSION = tfds.core.Version("1.0.0")

      def _info(self):
        # DatasetInfo directly: `dataset_info_from_configs` reads metadata files from
        # the builder's package directory, which a class in a test does not have.
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict(
            dict(question=tfds.features.Text(), answer=tfds.features.Text())))

      def _split_generators(self, dl_manager):
        return dict(train=self._generate_examples(range(6)),
                    test=self._generate_examples(range(6, 8)))

      def _generate_examples(self, indices):
        for i in indices:
          yield i, dict(question=f"What is {i} plus {i}?", answer=f"{i}+{i}\n#### {2 * i}")

  TinyGsm(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
  return "tiny_gsm"


def test_tfds_array_record_without_tensorflow(tmp_path):
  name = prepare_tfds(tmp_path)
  task = make_task(format="gsm8k", tfds_name=name, data_dir=str(tmp_path),
                   val_split="test")
  report = math_data.load(task)
  train, val = report.train, report.val
  # Array-record reads come back in record order, which TFDS shuffles when preparing.
  assert sorted(pairs(train)) == [(f"What is {i} plus {i}?", str(2 * i)) for i in range(6)]
  assert sorted(pairs(val)) == [(f"What is {i} plus {i}?", str(2 * i)) for i in (6, 7)]
  assert len(report.train) == 6 and len(report.val) == 2
  held = math_data.load(make_task(
      format="gsm8k", tfds_name=name, data_dir=str(tmp_path), num_val=2))
  assert (len(held.train), len(held.val)) == (4, 2)
  with pytest.raises(FileNotFoundError, match=r"tfds_name='nope': .*nope does not exist"):
    math_data.load(make_task(format="gsm8k", tfds_name="nope", data_dir=str(tmp_path)))
  with pytest.raises(ValueError, match=r"task\.val_split='validation'"):
    math_data.load(make_task(format="gsm8k", tfds_name=name, data_dir=str(tmp_path),
                             val_split="validation"))


def test_a_comma_in_a_file_name_is_kept_or_escaped_and_a_split_is_said(tmp_path):
  rows = [dict(q=f"What is {i}+7?", a=str(i + 7)) for i in range(6)]
  comma = write(rows, tmp_path / "a,b", "jsonl")
  assert "," in os.path.basename(comma)
  other = generic_file(tmp_path, 4)
  kw = dict(question_field="q", answer_field="a", num_val=1)
  whole = math_data.load(make_task(train_files=comma, **kw))
  escaped = math_data.load(make_task(train_files=comma.replace(",", "\\,") + "," + other, **kw))
  count = lambda loaded: len(loaded.train) + len(loaded.val)
  assert count(whole) == 6 and count(escaped) == 10
  with pytest.raises(FileNotFoundError, match=r"split at commas into paths; write a comma "
                     r"inside a name as \\,"):
    math_data.load(make_task(train_files=str(tmp_path / "x,y.jsonl"), **kw))
