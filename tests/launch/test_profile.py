"""Difficulty profiling: band thresholds, disjoint train/val, caching, and mixes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from isojax.base_models import demo_bases
from isojax.sweeps import profiling
from isojax.tasks import arithmetic, difficulty, splits

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
K = 8  # avg@8 in the end-to-end test, to keep it fast


def _profile(out, *extra):
  args = [sys.executable, "-m", "launch.profile", "--config=configs/hard.py:micro",
          f"--out={out}", "--pool_size=96",
          "--val_pool_size=24", "--num_train=16", "--num_val=4", f"--num_samples={K}",
          "--hard_samples=16", "--min_digits=3", "--max_digits=3", *extra]
  return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)


def _mtimes(out):
  return {name: os.stat(os.path.join(out, name)).st_mtime_ns for name in os.listdir(out)}


def _load(out, name):
  with open(os.path.join(out, f"{name}.json")) as f:
    return json.load(f)


@pytest.mark.slow("runs launch.profile twice as a subprocess")
def test_profile_writes_thresholded_disjoint_splits_and_reuses_them(tmp_path):
  # One test, so that parallel test workers never profile twice.
  out = tmp_path / "splits"
  proc = _profile(out, "--splits=hard,extremely_hard")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "hard" in proc.stdout and "extremely_hard" in proc.stdout  # the summary table

  # Thresholds, checked against the per-problem counts in profile.json.
  with open(os.path.join(out, profiling.PROFILE_FILE)) as f:
    table = json.load(f)
  measured = {r["prompt"]: r for part in ("train", "val") for r in table[part]}
  hard, extreme = _load(out, "hard"), _load(out, "extremely_hard")
  for payload in (hard, extreme):
    assert len(payload["train"]) == 16 and len(payload["val"]) == 4
  for row in hard["train"] + hard["val"]:
    assert row["pass_rate"] <= 0.0625
    assert row["pass_rate"] == measured[row["prompt"]]["correct"] / K
  for row in extreme["train"] + extreme["val"]:
    assert measured[row["prompt"]]["correct"] == 0
    assert measured[row["prompt"]]["hard_correct"] == 0 and row["pass_rate"] == 0.0
  # Every sample's length is recorded: K lengths within the cap, and no more cut
  # samples than samples at the cap.
  cap = 8  # configs/hard.py:micro's sampling.max_new_tokens
  for row in measured.values():
    assert len(row["lengths"]) == K and all(1 <= x <= cap for x in row["lengths"])
    assert 0 <= row["truncated"] <= sum(x == cap for x in row["lengths"])
  assert "tokens p50" in proc.stdout  # the pool table's length columns
  # The split meta records how it was made.
  meta = hard["meta"]
  assert meta["model"] == demo_bases.shipped_dir("arithmetic") and meta["num_samples"] == K
  assert meta["thresholds"] == {"hard": {"low": 0.0, "high": 0.0625}}
  assert meta["counts"]["num_train"] == 16 and meta["counts"]["requested_val"] == 4

  # Train and validation are disjoint; validation comes from the held-out partition.
  for name in ("hard", "extremely_hard"):
    train, val = splits.load_split(str(out), name)
    train_prompts, val_prompts = {p.prompt for p in train}, {p.prompt for p in val}
    assert len(train_prompts) == len(train) and not train_prompts & val_prompts
    assert all(arithmetic.is_validation(p) for p in val_prompts)
    assert not any(arithmetic.is_validation(p) for p in train_prompts)

  # The same call again reuses the files: nothing rewritten, nothing sampled.
  before = _mtimes(out)
  again = _profile(out, "--splits=hard,extremely_hard")
  assert again.returncode == 0, again.stderr[-3000:]
  assert "up to date" in again.stderr and _mtimes(out) == before
  # A changed setting redoes them.
  changed = _profile(out, "--splits=hard,extremely_hard", "--num_val=3")
  assert changed.returncode == 0, changed.stderr[-3000:]
  after = _mtimes(out)
  assert all(after[name] > before[name] for name in before)
  assert len(_load(out, "hard")["val"]) == 3


def test_empty_split_is_an_error_naming_it(tmp_path):
  # The base model, trained on sums of up to 3 digits, gets 6-digit sums wrong, so no
  # problem is easy ([0.3, 0.6]).
  proc = _profile(tmp_path / "splits", "--splits=hard,easy", "--pool_size=32",
                  "--val_pool_size=8", "--hard_samples=8", "--min_digits=6",
                  "--max_digits=6")
  assert proc.returncode == 1
  assert "empty split(s): easy (" in proc.stderr
  assert os.path.isfile(tmp_path / "splits" / "hard.json")  # the others are written


# --- Split selection, on made-up pass rates --------------------------------------------


def _rates(correct, hard_correct=None, k=16):
  problems = [arithmetic.Problem(prompt=f"{i}+0=", answer=str(i), difficulty=1)
              for i in range(len(correct))]
  hard = np.full(len(correct), -1) if hard_correct is None else np.asarray(hard_correct)
  return difficulty.ProblemRates(problems, np.asarray(correct), hard, k)


def test_bands_are_the_papers_with_inclusive_edges():
  # avg@16 = c / 16 for c = 0..16; expected members from the paper's intervals.
  rates = _rates(list(range(17)))
  c = np.arange(17) / 16
  for name, (lo, hi) in {"hard": (0, 0.0625), "easy": (0.3, 0.6),
                         "very_easy": (0.6, 0.9)}.items():
    assert rates.members(name) == np.flatnonzero((c >= lo) & (c <= hi)).tolist(), name
  assert rates.members("hard") == [0, 1] and rates.members("easy") == [5, 6, 7, 8, 9]


def test_extremely_hard_needs_zero_of_the_extra_samples():
  rates = _rates([0, 0, 0, 3], hard_correct=[0, 2, -1, -1])
  assert rates.members(difficulty.EXTREMELY_HARD) == [0]


def test_mixes_keep_their_proportions_and_shrink_when_a_class_runs_short():
  correct = [0] * 40 + [7] * 40 + [12] * 40  # hard, easy, very easy
  rates = _rates(correct)
  chosen, available = difficulty.select(rates, difficulty.SPLITS["mix_hard_easy_veryeasy"], 16)
  assert available == {"hard": 40, "easy": 40, "very_easy": 40}
  classes = [correct[i] for i in chosen]
  assert (classes.count(0), classes.count(7), classes.count(12)) == (8, 4, 4)
  # Only 3 easy problems: a 50/50 mix of 16 becomes 3 + 3.
  short = _rates([0] * 40 + [7] * 3)
  chosen, _ = difficulty.select(short, difficulty.SPLITS["mix_hard_easy"], 16)
  assert sorted(correct_ for correct_ in (short.correct_G[i] for i in chosen)) == [0] * 3 + [7] * 3


def test_empty_split_is_reported_by_name_and_short_ones_are_kept():
  train = _rates([0, 0, 0, 0, 0, 7, 7])     # no very easy problem at all
  val = _rates([0, 0, 7, 12])
  plans, empty = difficulty.plan_splits(train, val, ("hard", "easy", "very_easy"),
                                        num_train=4, num_val=2)
  assert [p.name for p in plans] == ["hard", "easy"]
  assert [len(p.train) for p in plans] == [4, 2]   # easy: only 2 of 4, still written
  assert len(empty) == 1 and empty[0].startswith("very_easy")


@pytest.mark.parametrize("available_mib", [64 * 1024, 40])
def test_profile_sampler_calls_fit_the_memory(tmp_path, monkeypatch, available_mib):
  """With the memory there is, every --chunk_rollouts chunk is one sampler call; with
  little, each call holds the most rollouts that fit beside the weights (brute force
  over call sizes here), and the model is profiled with those calls."""
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.configs import hard  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from isojax.run import evaluation, memory_estimates, memory_plan, run_inputs
  seen = []

  def correct_counts(graphdef, params, tok, book, problems, verifier, *, num_samples,
                     chunk, rng, sampling, done, on_chunk):
    del graphdef, params, tok, verifier, chunk, rng, done, on_chunk
    seen.append((sampling.max_rollouts_per_call, book.max_len))
    g = len(problems)  # no sampling: avg 0.5, easy
    return evaluation.SampleCounts(np.full(g, num_samples // 2),
                                   np.ones((g, num_samples), int),
                                   np.zeros((g, num_samples), bool))
  monkeypatch.setattr(evaluation, "correct_counts", correct_counts)
  available = available_mib * 1024 ** 2
  monkeypatch.setattr(memory_plan, "available_bytes", lambda: (available, "cpu"))
  config = hard.get_config("micro")
  options = profiling.Options(out_dir=str(tmp_path), num_samples=8, hard_samples=16,
                              pool_size=32, val_pool_size=8, num_train=4, num_val=2,
                              min_digits=3, max_digits=3, splits=("easy",))
  profiling.profile(config, options)
  assert seen and len(set(seen)) == 1
  calls, prompt_len = seen[0]
  resolved = config_lib.resolve(config)
  s = config_lib.settings(resolved)
  shape = memory_estimates.Shape.of(run_inputs.checked_model_config(s, run_inputs.policy_path(s),
                                                          prompt_len))
  new_tokens = resolved.sampling.max_new_tokens
  fits = lambda r: (4 * shape.params + memory_estimates.sample_bytes(shape, r, prompt_len,
                                                                     new_tokens)
                         <= available * memory_plan.USABLE_FRACTION["cpu"])
  if fits(options.chunk_rollouts):
    assert available_mib > 1024 and calls == 0  # one call per chunk
  else:
    assert available_mib == 40 and fits(calls) and not fits(calls + 1) and calls >= 16


def test_a_profile_stopped_part_way_resumes_and_equals_an_uninterrupted_one(
    tmp_path, monkeypatch):
  """Stopped at its third sampler call (in the training pool's avg@k), a profile keeps
  the two chunks it measured; the rerun samples only the others and writes the same
  per-problem counts, lengths and splits as a profile never stopped. Its journal is gone
  afterwards, and one with other settings is not used."""
  from isojax.configs import hard  # pylint: disable=g-import-not-at-top
  from isojax.run import evaluation  # pylint: disable=g-import-not-at-top
  from isojax.sweeps import profile_journal  # pylint: disable=g-import-not-at-top
  real_generate, calls = evaluation.rollout.generate, []

  def generate(*args, **kwargs):
    calls.append(len(args[4]))
    if stop_at[0] and len(calls) == stop_at[0]:
      raise KeyboardInterrupt("preempted")
    return real_generate(*args, **kwargs)
  monkeypatch.setattr(evaluation.rollout, "generate", generate)
  stop_at = [0]

  def options(out, **overrides):
    return profiling.Options(**dict(
        out_dir=str(out), num_samples=4, hard_samples=8, pool_size=24, val_pool_size=8,
        num_train=4, num_val=2, min_digits=3, max_digits=3, chunk_rollouts=32,
        splits=("hard", "extremely_hard")) | overrides)
  config = hard.get_config("micro")

  profiling.profile(config, options(tmp_path / "whole"))
  whole_calls = len(calls)
  assert whole_calls >= 4  # train 3 chunks of 8 problems, val 1, the extra rounds

  calls.clear()
  stop_at[0] = 3
  with pytest.raises(KeyboardInterrupt):
    profiling.profile(config, options(tmp_path / "stopped"))
  saved = json.loads((tmp_path / "stopped" / profile_journal.PARTIAL_FILE).read_text())
  assert sorted(saved["passes"]["train"]) == ["0", "8"]
  assert not os.path.exists(tmp_path / "stopped" / profiling.PROFILE_FILE)

  calls.clear()
  stop_at[0] = 0
  profiling.profile(config, options(tmp_path / "stopped"))
  assert len(calls) == whole_calls - 2
  for name in (profiling.PROFILE_FILE, "hard.json", "extremely_hard.json"):
    got, want = (json.loads((tmp_path / d / name).read_text()) for d in ("stopped", "whole"))
    for payload in (got, want):
      payload.get("meta", {}).pop("created", None)
    assert got == want, name
  assert not os.path.exists(tmp_path / "stopped" / profile_journal.PARTIAL_FILE)

  # A journal of other settings (here: another chunk size) is not read.
  calls.clear()
  stop_at[0] = 2
  with pytest.raises(KeyboardInterrupt):
    profiling.profile(config, options(tmp_path / "other"))
  stop_at[0] = 0
  calls.clear()
  profiling.profile(config, options(tmp_path / "other", chunk_rollouts=64))
  assert calls[0] == 16 and len(calls) >= 3  # chunks of 16 problems, from the first


def test_pool_table_reports_each_difficultys_lengths_and_cut_fraction(tmp_path):
  """The pool table's length columns, against order statistics counted by hand."""
  def row(difficulty, correct, lengths, truncated):
    return dict(prompt=f"{difficulty}-{correct}-{lengths}", answer="1",
                difficulty=difficulty, correct=correct, hard_correct=None,
                lengths=lengths, truncated=truncated)
  train = [row(2, 2, [1, 2, 3, 40], 1), row(2, 0, [5, 6, 7, 8], 0)]
  val = [row(3, 4, [10, 10, 10, 10], 0)]
  with open(tmp_path / profiling.PROFILE_FILE, "w") as f:
    json.dump(dict(settings=dict(num_samples=4), train=train, val=val), f)
  lines = splits.pool_table(str(tmp_path)).splitlines()
  assert lines[0].split()[-4:] == ["p50", "p90", "max", "cut"]
  by_name = {line.split()[0]: line.split() for line in lines[1:]}
  # Difficulty 2: lengths 1 2 3 5 6 7 8 40; median (5 + 6) / 2 = 5.5 -> "6" (round half
  # to even gives 6); p90 at rank 0.9 * 7 = 6.3: 8 + 0.3 * (40 - 8) = 17.6 -> "18".
  assert by_name["2"][1:3] == ["2", "0.250"]
  assert by_name["2"][-4:] == ["6", "18", "40", f"{1 / 8:.3f}"]
  assert by_name["3"][-4:] == ["10", "10", "10", "0.000"]
  # All 12 samples: sorted 1 2 3 5 6 7 8 10 10 10 10 40; median 7.5 -> "8";
  # p90 at rank 0.9 * 11 = 9.9, between the 10 at ranks 9 and 10: 10.
  assert by_name["all"][1:3] == ["3", f"{(0.5 + 0 + 1) / 3:.3f}"]
  assert by_name["all"][-4:] == ["8", "10", "40", f"{1 / 12:.3f}"]
