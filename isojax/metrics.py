"""Metric names and the unbiased best@k / worst@k / avg@k estimators.

All metric names that cross a module boundary (the main loop writes them, analysis
reads them) are spelled here. Estimators are pure NumPy: from N >= k samples per
problem with c correct,

  best@k  (pass@k, coverage)  = 1 - C(N - c, k) / C(N, k)
  worst@k (sharpening)        = C(c, k) / C(N, k)
  avg@k                       = c / N   (mean reward; unbiased for any k <= N)

each averaged over problems.
"""

from __future__ import annotations

import numpy as np

# Training-side metrics.
TRAIN_REWARD = "train/reward"
TRAIN_ENTROPY = "train/entropy"
TRAIN_KL = "train/kl"
TRAIN_LOSS = "train/loss"
TRAIN_CLIP_FRACTION = "train/clip_fraction"
TRAIN_GRAD_NORM = "train/grad_norm"
TRAIN_LR = "train/learning_rate"
TRAIN_ZERO_VARIANCE = "train/zero_variance_fraction"
TRAIN_RESPONSE_LENGTH = "train/response_length"
TRAIN_PASS1_HISTOGRAM = "train/pass@1_histogram"  # problems with 0..N of N correct
# Lists of counts per bucket, which metric viewers show as histograms.
HISTOGRAMS = (TRAIN_PASS1_HISTOGRAM,)
# Per-problem correct counts (of eval.num_samples), in the problems' order: what a
# bootstrap over problems resamples. Kept in metrics.jsonl only: not scalars, not
# histograms, and too long for a log line.
VAL_CORRECT_COUNTS = "val/correct_counts"          # one per validation problem
TRAIN_PASS1_COUNTS = "train/pass@1_counts"         # behind TRAIN_PASS1_HISTOGRAM
PER_PROBLEM_COUNTS = (VAL_CORRECT_COUNTS, TRAIN_PASS1_COUNTS)
# Rollouts of each of the step's problems (rl.allocation='per_problem'): a list, kept in
# metrics.jsonl only.
TRAIN_GROUP_SIZES = "train/group_sizes"
TRAIN_ACTIVE_PROBLEMS = "train/active_problems"    # after No-Positive-Resampling
TRAIN_TRUNCATED = "train/truncated_fraction"       # rollouts that hit max_new_tokens
TRAIN_INTERRUPTED = "train/interrupted_fraction"   # rollouts given the interruption text
TRAIN_VERIFIER_TIMEOUTS = "train/verifier_timeouts"  # completions cut off (scored 0)
TRAIN_VERIFIER_ERRORS = "train/verifier_errors"      # completions whose grading failed
TRAIN_SHAPED_REWARD = "train/shaped_reward"        # what the update optimises (rl.overlong)
TASK_SKIPPED_PREFIX = "task/skipped/"              # rows dropped at load time, by reason
TASK_SKIPPED_ROWS_PREFIX = "task/skipped_rows/"    # the first few of them, "<file> row <i>"

# Events: metrics.jsonl rows with an `event` key (run_dir.EVENT) and a `message`,
# which run_dir.read_metrics leaves out and run_dir.read_events returns.
EVENT_NON_FINITE = "non_finite"            # loss, gradients or parameters; the run stops
EVENT_COLLAPSE = "collapse"                # zero reward and gradient for guard.collapse_steps
EVENT_CHECKPOINT_CORRUPT = "checkpoint_corrupt"  # moved aside; an older one restored
EVENT_PREEMPTED = "preempted"              # SIGTERM: this step saved, the run stopped
EVENT_SETTINGS_CHANGED = "settings_changed"  # resumed with --allow_changed fields changed
EVENT_IN_FLIGHT_RESTARTED = "in_flight_restarted"  # resumed in flight: sampling restarts

VAL_PREFIX = "val/"
VAL_TRUNCATED = "val/truncated_fraction"


def val_avg(k: int) -> str:
  return f"val/avg@{k}"


def val_best(k: int) -> str:
  return f"val/best@{k}"


def val_worst(k: int) -> str:
  return f"val/worst@{k}"


def val_stderr(k: int) -> str:
  """Standard error over problems of val/avg@k."""
  return f"val/avg@{k}_stderr"


def _log_comb(n: np.ndarray, k: int) -> np.ndarray:
  from scipy.special import gammaln  # pylint: disable=g-import-not-at-top
  return gammaln(n + 1) - gammaln(k + 1) - gammaln(n - k + 1)


def _check(num_correct_G, num_samples: int, k: int) -> np.ndarray:
  c = np.asarray(num_correct_G, dtype=np.int64)
  if not 1 <= k <= num_samples:
    raise ValueError(f"k={k} must lie in [1, num_samples={num_samples}]")
  if np.any((c < 0) | (c > num_samples)):
    raise ValueError(f"correct counts must lie in [0, {num_samples}]")
  return c


def best_at_k_per_problem(num_correct_G, num_samples: int, k: int) -> np.ndarray:
  """Unbiased pass@k of each problem, [G] float64."""
  c = _check(num_correct_G, num_samples, k)
  n_wrong = num_samples - c
  out = np.ones(c.shape, np.float64)
  has_k_wrong = n_wrong >= k
  out[has_k_wrong] = 1.0 - np.exp(
      _log_comb(n_wrong[has_k_wrong], k) - _log_comb(np.asarray(num_samples), k))
  return out


def worst_at_k_per_problem(num_correct_G, num_samples: int, k: int) -> np.ndarray:
  """Unbiased probability that all k of k samples are correct, [G] float64."""
  c = _check(num_correct_G, num_samples, k)
  out = np.zeros(c.shape, np.float64)
  has_k = c >= k
  out[has_k] = np.exp(_log_comb(c[has_k], k) - _log_comb(np.asarray(num_samples), k))
  return out


def summarize_correct(num_correct_G, num_samples: int, k: int) -> dict[str, float]:
  """avg@k, best@k, worst@k and the standard error of avg@k over problems."""
  c = _check(num_correct_G, num_samples, k)
  per_problem = c / num_samples
  stderr = (per_problem.std(ddof=1) / np.sqrt(len(c))) if len(c) > 1 else 0.0
  return {
      val_avg(k): float(per_problem.mean()),
      val_best(k): float(best_at_k_per_problem(c, num_samples, k).mean()),
      val_worst(k): float(worst_at_k_per_problem(c, num_samples, k).mean()),
      val_stderr(k): float(stderr),
  }


def pass_count_histogram(num_correct_G, num_samples: int) -> list[int]:
  """Problems with 0, 1, ..., N correct of N samples: the pass@1 histogram.

  One bin per attainable pass@1 value c / N, so no bin is empty by construction
  (the interference diagnostic: mass moving to both ends means some problems are
  being solved while others are forgotten).
  """
  c = _check(num_correct_G, num_samples, 1)
  return np.bincount(c, minlength=num_samples + 1).tolist()


# Wall seconds of one RL step's phases (`train.run` logs them with the step's metrics).
# sample: prompts to rollouts on the host (device sampling and the transfer); decode and
# grade: the host thread's text decoding and verification, which overlap the log-prob
# passes; grade_wait: what of them the main thread still waited for; update: batch
# assembly, the rest of the log-prob passes and the optimizer step; other: the rest of
# the step (problem choice, prefetch dispatch, ...); eval: evaluation, when it ran.
# Off-policy runs (rl.max_staleness > 0) sample on the generator's thread, beside the
# update: there sample, decode, grade and grade_wait are the generator's, and
# rollout_wait is what the main thread waited for the step's batch.
TIME_PREFIX = "time/"
TIME_STEP = "time/step_s"
TIME_EVAL = "time/eval_s"
TIME_ROLLOUT_WAIT = "time/rollout_wait_s"
TIMED_PHASES = ("sample_s", "decode_s", "grade_s", "grade_wait_s")


# Memory: the plan's estimated peak per device (`isojax.run.memory_plan`, on the step-0 line)
# and, on an accelerator, the device's measured peak so far (every step line), in GiB.
# Facts of the machine, like the timings: equal runs on other machines differ in them.
MEMORY_PREFIX = "memory/"
MEMORY_PLANNED = MEMORY_PREFIX + "planned_peak_gib"
MEMORY_DEVICE_PEAK = MEMORY_PREFIX + "device_peak_gib"


def step_timings(rollout_timings: dict[str, float], *, update_s: float, step_s: float,
                 rollout_wait_s: float | None = None) -> dict[str, float]:
  """The `time/...` metrics of a step from its rollout phases and update.

  `rollout_wait_s` is given when the rollouts were sampled on another thread.
  """
  out = {TIME_PREFIX + k: float(rollout_timings[k]) for k in TIMED_PHASES}
  if rollout_wait_s is None:
    on_main_thread = out["time/sample_s"] + out["time/grade_wait_s"] + update_s
  else:
    on_main_thread = rollout_wait_s + update_s
    out[TIME_ROLLOUT_WAIT] = rollout_wait_s
  out.update({"time/update_s": update_s, TIME_STEP: step_s,
              "time/other_s": max(step_s - on_main_thread, 0.0)})
  return out
