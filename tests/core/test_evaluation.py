"""Evaluation schedules and per-problem counts: a log-spaced micro run evaluates at the
steps `EvalSettings.steps` names, and the per-problem correct counts it logs
reproduce its avg@k / best@k / worst@k and pass@1 histogram through math.comb."""

import importlib.util
import logging
import math
import os
import shutil
import types

import jax
import numpy as np
import pytest
from absl import logging as absl_logging

from isojax import eval_settings, metrics, run_dir
from isojax.config import config_lib
from isojax.planner import records
from isojax.run import evaluation, train
from isojax.sampling import settings as sampling_settings
from isojax.tasks.problem import Problem

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_STEPS, COUNT = 5, 3
# round(geomspace(1, 5, 3)) = round(1, 2.236, 5); the linear micro schedule
# (every 2) would instead evaluate at 0, 2, 4, 5.
LOG_STEPS = [0, 1, 2, 5]


def _independent_summary(counts_G, num_samples, k):
  """avg@k, best@k, worst@k and avg's standard error from exact binomials."""
  c = [int(x) for x in counts_G]
  total = math.comb(num_samples, k)
  per_problem = np.array(c) / num_samples
  return {
      metrics.val_avg(k): float(np.mean(per_problem)),
      metrics.val_best(k): float(np.mean([1 - math.comb(num_samples - x, k) / total
                                          for x in c])),
      metrics.val_worst(k): float(np.mean([math.comb(x, k) / total for x in c])),
      metrics.val_stderr(k): float(np.std(per_problem, ddof=1) / math.sqrt(len(c))),
  }


# ==================== evaluate() on a fake sampler: order and chunk padding ====

def _fake_generate(graphdef, params, tok, book, problems, verifier, *, n, rng, sampling):
  """Problem with answer a gets exactly a % (n + 1) of its n samples right."""
  del graphdef, params, tok, book, verifier, rng, sampling
  correct_G = np.array([int(p.answer) % (n + 1) for p in problems])
  rewards_GN = (np.arange(n)[None, :] < correct_G[:, None]).astype(np.float32)
  finished_B = np.ones(len(problems) * n, bool)
  finished_B[::3] = False  # a third of the rollouts truncated, padding included
  # Sample s of problem p is int(p.prompt[1:]) * 10 + s tokens long.
  lengths_B = np.array([int(p.prompt[1:]) * 10 + s for p in problems for s in range(n)])
  return types.SimpleNamespace(rewards_GN=rewards_GN, rollouts=types.SimpleNamespace(
      finished=finished_B, lengths=lengths_B))


def test_correct_counts_keep_each_samples_length_and_cut_in_problem_order(monkeypatch):
  """7 problems in calls of 3 (the last padded): each problem's own samples' lengths,
  and the truncated flags of the real rows only."""
  monkeypatch.setattr(evaluation.rollout, "generate", _fake_generate)
  problems = [Problem(prompt=f"v{i}", answer=str(i)) for i in range(7)]
  got = evaluation.correct_counts(None, None, None, None, problems, None, num_samples=4,
                                  chunk=3, rng=jax.random.key(0),
                                  sampling=sampling_settings.SamplingSettings())
  np.testing.assert_array_equal(got.correct_G, [i % 5 for i in range(7)])
  np.testing.assert_array_equal(got.lengths_GN,
                                [[i * 10 + s for s in range(4)] for i in range(7)])
  # Within each call of 3 problems x 4 samples, rows 0, 3, 6, 9 are cut.
  cut_in_call = [r % 3 == 0 for r in range(12)]
  expected = [cut_in_call[(i % 3) * 4:(i % 3) * 4 + 4] for i in range(7)]
  np.testing.assert_array_equal(got.truncated_GN, expected)


def test_correct_counts_take_measured_chunks_as_they_are_and_report_the_others(monkeypatch):
  """Chunks given in `done` are not sampled again; every other chunk is sampled with the
  key of an uninterrupted call (its first problem's index folded in) and reported to
  `on_chunk`: a call resumed from what an interrupted one reported equals it."""
  keys = []

  def generate(*args, rng, **kwargs):
    keys.append(np.asarray(jax.random.key_data(rng)).tolist())
    return _fake_generate(*args, rng=rng, **kwargs)
  monkeypatch.setattr(evaluation.rollout, "generate", generate)
  problems = [Problem(prompt=f"v{i}", answer=str(i)) for i in range(7)]
  rng = jax.random.key(3)
  kwargs = dict(num_samples=4, chunk=3, rng=rng, sampling=sampling_settings.SamplingSettings())
  reported = {}
  whole = evaluation.correct_counts(None, None, None, None, problems, None,
                                    on_chunk=reported.__setitem__, **kwargs)
  assert sorted(reported) == [0, 3, 6]
  assert keys == [np.asarray(jax.random.key_data(jax.random.fold_in(rng, s))).tolist()
                  for s in (0, 3, 6)]
  # Resumed with chunk 3 measured: only 0 and 6 are sampled, with their own keys.
  keys.clear()
  again = {}
  resumed = evaluation.correct_counts(None, None, None, None, problems, None,
                                      done={3: reported[3]}, on_chunk=again.__setitem__,
                                      **kwargs)
  assert sorted(again) == [0, 6] and len(keys) == 2
  for field in evaluation.SampleCounts._fields:
    np.testing.assert_array_equal(getattr(resumed, field), getattr(whole, field))
  # What `done` holds is taken as it is (here: not what sampling would give).
  planted = evaluation.SampleCounts(np.array([9, 9, 9]), np.zeros((3, 4), int),
                                    np.ones((3, 4), bool))
  got = evaluation.correct_counts(None, None, None, None, problems, None, done={3: planted},
                                  **kwargs)
  np.testing.assert_array_equal(got.correct_G, [0, 1, 2, 9, 9, 9, 6 % 5])


def test_evaluate_reports_counts_per_problem_in_order(monkeypatch):
  monkeypatch.setattr(evaluation.rollout, "generate", _fake_generate)
  # 7 problems in calls of 3: 3 + 3 + 1 padded
  settings = eval_settings.EvalSettings(num_samples=4, k=2, chunk_problems=3)
  sampling = sampling_settings.SamplingSettings()
  answers = [3, 0, 4, 1, 2, 9, 4]
  val = [Problem(prompt=f"v{i}", answer=str(a)) for i, a in enumerate(answers)]
  train_answers = [0, 4, 4, 2, 1]
  histogram = [Problem(prompt=f"t{i}", answer=str(a)) for i, a in enumerate(train_answers)]
  result = evaluation.evaluate(None, None, None, None, val, None, settings, sampling,
                               rng=jax.random.key(0), histogram_problems=histogram)
  expected_P = [a % 5 for a in answers]
  assert result[metrics.VAL_CORRECT_COUNTS] == expected_P == [3, 0, 4, 1, 2, 4, 4]
  assert all(type(c) is int for c in result[metrics.VAL_CORRECT_COUNTS])  # JSON-ready
  for name, value in _independent_summary(expected_P, 4, 2).items():
    assert result[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
  assert result[metrics.TRAIN_PASS1_COUNTS] == [0, 4, 4, 2, 1]
  assert result[metrics.TRAIN_PASS1_HISTOGRAM] == [1, 1, 1, 0, 2]
  without = evaluation.evaluate(None, None, None, None, val, None, settings, sampling,
                                rng=jax.random.key(0))
  assert metrics.TRAIN_PASS1_COUNTS not in without
  assert without[metrics.VAL_CORRECT_COUNTS] == expected_P


# ==================== A log-scheduled micro run ====================

def _micro_config(cache_dir):
  module = importlib.import_module("isojax.configs.hard")
  config = module.get_config("micro")
  del cache_dir  # the shipped base model: nothing to build
  # Two-digit sums: the base model solves some problems, so the counts below are not
  # all zero.
  config.task.update(min_digits=1, max_digits=2)
  config.num_steps = NUM_STEPS
  config.eval.update(schedule="log", count=COUNT)
  config.metric_writers.tensorboard = False
  return config


class _Messages(logging.Handler):
  def __init__(self):
    super().__init__(logging.INFO)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def log_run(tmp_path_factory):
  """(config, workdir, returned metrics, absl log messages) of one log-scheduled run."""
  root = tmp_path_factory.mktemp("log_run")
  config = _micro_config(root / "cache")
  handler, absl_logger = _Messages(), logging.getLogger("absl")
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  absl_logger.addHandler(handler)
  try:
    final = train.run(config, str(root / "run"))
  finally:
    absl_logger.removeHandler(handler)
    absl_logging.set_verbosity(verbosity)
  return config, root / "run", final, handler.messages


def test_log_schedule_evaluates_at_its_steps(log_run):
  config, workdir, _, messages = log_run
  schedule = eval_settings.EvalSettings.from_config(config_lib.resolve(config).eval)
  assert sorted(schedule.steps(NUM_STEPS)) == LOG_STEPS
  lines = run_dir.read_metrics(str(workdir))
  assert [r["step"] for r in lines] == list(range(NUM_STEPS + 1))  # log_every=1
  k = config.eval.k
  for name in (metrics.val_avg(k), metrics.VAL_CORRECT_COUNTS, metrics.TRAIN_PASS1_COUNTS):
    assert [r["step"] for r in lines if name in r] == LOG_STEPS, name
  assert [r["step"] for r in lines if metrics.TIME_EVAL in r] == LOG_STEPS[1:]
  # Checkpoints keep their own cadence (micro: every 2 steps and the last).
  assert {int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit()} == {4, 5}
  evals = [m for m in messages if " eval: " in m]
  assert len(evals) == len(LOG_STEPS)
  assert all(metrics.val_avg(k) + "=" in m and "_counts" not in m for m in evals)


def test_logged_counts_reproduce_the_logged_metrics(log_run):
  config, workdir, final, _ = log_run
  n_samples, k = config.eval.num_samples, config.eval.k
  evaluated = [r for r in run_dir.read_metrics(str(workdir)) if metrics.val_avg(k) in r]
  assert len(evaluated) == len(LOG_STEPS)
  for line in evaluated:
    counts_G = line[metrics.VAL_CORRECT_COUNTS]
    assert len(counts_G) == config.task.num_val
    assert all(isinstance(c, int) and 0 <= c <= n_samples for c in counts_G)
    for name, value in _independent_summary(counts_G, n_samples, k).items():
      assert line[name] == pytest.approx(value, rel=1e-9, abs=1e-12), (line["step"], name)
    train_P = line[metrics.TRAIN_PASS1_COUNTS]
    assert len(train_P) == min(config.eval.train_problems, config.task.num_train)
    assert np.bincount(train_P, minlength=n_samples + 1).tolist() == (
        line[metrics.TRAIN_PASS1_HISTOGRAM])
  # The counts vary across problems (some reach k), so the formulas above were not
  # checked on zeros alone.
  assert all(len(set(r[metrics.TRAIN_PASS1_COUNTS])) > 1 for r in evaluated)
  assert all(len(set(r[metrics.VAL_CORRECT_COUNTS])) > 1 for r in evaluated)
  assert any(r[metrics.val_worst(k)] > 0 for r in evaluated)
  # The returned summary and the analysable metric names leave the lists out.
  assert final[metrics.val_avg(k)] == evaluated[-1][metrics.val_avg(k)]
  assert not set(final) & set(metrics.PER_PROBLEM_COUNTS)
  names = records.metric_names([run_dir.load_run(str(workdir))])
  assert metrics.val_avg(k) in names and not set(names) & set(metrics.PER_PROBLEM_COUNTS)


def test_log_scheduled_run_resumes_to_the_same_lines(log_run, tmp_path):
  config, workdir, _, _ = log_run
  interrupted = tmp_path / "interrupted"
  shutil.copytree(workdir, interrupted)
  shutil.rmtree(interrupted / "checkpoints" / str(NUM_STEPS))  # resumes from step 4
  train.run(config, str(interrupted))
  strip = lambda lines: [run_dir.without_timings(r) for r in lines]
  assert strip(run_dir.read_metrics(str(interrupted))) == strip(
      run_dir.read_metrics(str(workdir)))
