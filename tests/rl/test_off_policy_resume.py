"""Off-policy runs killed at random steps resume without losing or repeating anything.

Each test runs `isojax.main` as a subprocess, kills it with SIGKILL once a randomly
drawn step is logged (the kill lands somewhere in the next step: sampling, the update
or a save), reruns it, sends that rerun SIGTERM at a later random step (it saves the
step it reached and exits 0), and reruns it to the end. The steps drawn are in every
assertion's message.

- PipelineRL-k (`configs/scalerl.py`) and dynamic sampling (`configs/dapo.py`) are
  deterministic: the interrupted run's metrics equal an uninterrupted run's, line for
  line, timings aside. Their checkpoints hold the batches sampled ahead (and, with
  dynamic sampling, the rollouts and rounds it took).
- In flight (`rl.off_policy=pipeline_in_flight`) depends on timing, so no two runs are
  equal; what a resume must keep is the accounting: every step logged once, each step's
  rollouts counted once (B_p * n trained plus the ones dropped as too stale), the
  discarded batches recorded in the preemption event and the restart recorded as an
  event.
"""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from isojax import metrics, run_dir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_STEPS = 10
COMMON = [f"--config.num_steps={NUM_STEPS}", "--config.checkpoint_every=2",
          "--config.log_every=1", "--config.eval.every=5", "--config.eval.train_problems=0"]


def _start(workdir, flags):
  return subprocess.Popen([sys.executable, "-m", "isojax.main", *flags, *COMMON,
                           f"--workdir={workdir}"], cwd=ROOT,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _finish(proc, what):
  _, stderr = proc.communicate(timeout=600)
  assert proc.returncode == 0, f"{what}: exit {proc.returncode}\n{stderr[-3000:]}"
  return stderr


def _logged_steps(workdir):
  try:
    return [line[run_dir.STEP] for line in run_dir.read_metrics(str(workdir))]
  except (run_dir.RunFormatError, OSError):
    return []


def _signal_at(proc, workdir, step, signum, what):
  """Sends `signum` once `step` is logged; fails if the run ends first."""
  deadline = time.time() + 300
  while proc.poll() is None and time.time() < deadline:
    if step in _logged_steps(workdir):
      proc.send_signal(signum)
      break
    time.sleep(0.02)
  assert proc.poll() is None or proc.returncode == -signum or signum == signal.SIGTERM, what
  return proc


def _interrupted_run(workdir, flags, rng):
  """SIGKILL after a random step, then SIGTERM to the rerun after a later random step,
  then a rerun to the end. Returns (what was drawn, the SIGTERM'd rerun's stderr).

  The SIGTERM step is drawn past every step the killed run logged (it may log one or two
  more before the kill lands), so it can only be the rerun's own line: the rerun keeps
  the killed run's lines up to its checkpoint until it has started up.
  """
  kill_step = rng.randint(3, NUM_STEPS - 5)
  what = f"SIGKILL after step {kill_step}"
  proc = _signal_at(_start(workdir, flags), workdir, kill_step, signal.SIGKILL, what)
  proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, f"{what}: the run ended before the kill"
  killed_last = max(_logged_steps(workdir))
  assert killed_last <= NUM_STEPS - 3, f"{what}: the killed run logged up to {killed_last}"
  term_step = rng.randint(killed_last + 1, NUM_STEPS - 2)
  what += f" (it logged up to {killed_last}), SIGTERM after step {term_step}"
  proc = _signal_at(_start(workdir, flags), workdir, term_step, signal.SIGTERM, what)
  stderr = _finish(proc, what + " (the SIGTERM'd rerun exits 0)")
  assert "preempted after" in stderr, f"{what}: {stderr[-2000:]}"
  _finish(_start(workdir, flags), what + " (the last rerun)")
  return what, stderr


def _without_timings(workdir):
  return [run_dir.without_timings(line) for line in run_dir.read_metrics(str(workdir))]


@pytest.mark.slow("four runs of isojax.main, two of them killed")
def test_killed_and_preempted_runs_equal_an_uninterrupted_one(tmp_path):
  """PipelineRL-8 with dynamic sampling: the checkpoints hold up to 8 batches sampled
  ahead, each with the rounds it took."""
  flags = ["--config=configs/scalerl.py:micro", "--config.rl.dynamic_sampling=True"]
  _finish(_start(tmp_path / "full", flags), "the uninterrupted run")
  what, _ = _interrupted_run(tmp_path / "killed", flags, random.Random())
  want, got = _without_timings(tmp_path / "full"), _without_timings(tmp_path / "killed")
  assert [line[run_dir.STEP] for line in got] == list(range(NUM_STEPS + 1)), what
  assert got == want, what
  # The runs really took extra rounds, and resumed through them.
  assert max(line.get("train/sampling_rounds", 1) for line in want) > 1


@pytest.mark.slow("four runs of isojax.main, two of them killed")
def test_pipelined_per_problem_allocation_resumes_its_unequal_groups(tmp_path):
  """PipelineRL-2 with per-problem allocation: the batches sampled ahead hold groups of
  unequal size, and the checkpoint keeps each batch's sizes, so the interrupted run
  equals an uninterrupted one line for line."""
  # Every step the same 4 problems, so their history moves rollouts between them.
  flags = ["--config=configs/per_problem.py:micro", "--config.rl.max_staleness=2",
           "--config.rl.off_policy=pipeline", "--config.task.num_train=4",
           "--config.rl.allocation_n_max=8"]
  _finish(_start(tmp_path / "full", flags), "the uninterrupted run")
  what, _ = _interrupted_run(tmp_path / "killed", flags, random.Random())
  want, got = _without_timings(tmp_path / "full"), _without_timings(tmp_path / "killed")
  assert [line[run_dir.STEP] for line in got] == list(range(NUM_STEPS + 1)), what
  assert got == want, what
  sizes = [line["train/group_sizes"] for line in want if "train/group_sizes" in line]
  assert len(sizes) == NUM_STEPS and any(len(set(s)) > 1 for s in sizes)
  assert all(sum(s) == sum(sizes[0]) for s in sizes)
  assert max(line["train/staleness_max"] for line in want if line[run_dir.STEP]) == 2


@pytest.mark.slow("three runs of isojax.main in flight, two of them killed")
def test_in_flight_resume_counts_every_rollout_once_and_records_what_it_lost(tmp_path):
  flags = ["--config=configs/scalerl.py:micro", "--config.rl.off_policy=pipeline_in_flight",
           "--config.rl.max_staleness=2", "--config.rl.in_flight_tokens=4"]
  workdir = tmp_path / "run"
  what, stderr = _interrupted_run(workdir, flags, random.Random())
  steps, events = run_dir.read_metrics(str(workdir)), run_dir.read_events(str(workdir))
  assert [line[run_dir.STEP] for line in steps] == list(range(NUM_STEPS + 1)), what
  # B_p * n = 16 trained rollouts a step, plus the ones dropped as too stale: the
  # counter never counts a rollout twice across the two restarts.
  for before, line in zip(steps, steps[1:]):
    assert (line[run_dir.ROLLOUTS] - before[run_dir.ROLLOUTS]
            == 16 + line["train/dropped_rollouts"]), (what, line[run_dir.STEP])
  (preempted,) = [e for e in events if e[run_dir.EVENT] == metrics.EVENT_PREEMPTED]
  assert preempted["discarded_rollouts"] >= 0 and "discarded" in preempted["message"], what
  assert "discarded" in stderr, what
  restarts = [e for e in events if e[run_dir.EVENT] == metrics.EVENT_IN_FLIGHT_RESTARTED]
  assert len(restarts) == 2, (what, events)  # after the SIGKILL and after the SIGTERM
  for event in restarts:  # batches consumed = steps trained + batches dropped (16 each)
    dropped = sum(line.get("train/dropped_rollouts", 0) for line in steps
                  if line[run_dir.STEP] <= event[run_dir.STEP]) // 16
    assert event["first_batch"] == event[run_dir.STEP] + dropped, (what, event)
