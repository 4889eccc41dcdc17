"""Save on preemption and one writer per workdir: SIGTERM mid-run saves the step reached
and the rerun ends exactly as an uninterrupted run; a held workdir refuses a second run."""

import dataclasses
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from isojax import metrics, run_dir
from isojax.rl import batch as rl_batch
from isojax.run import evaluation, preemption, train, workdir_lock
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import runner
from isojax.tasks import prompts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _micro():
  # The easy recipe's KL and entropy terms move the parameters at every step.
  config = importlib.import_module("isojax.configs.easy").get_config("micro")
  config.update(dict(num_steps=4, checkpoint_every=2, log_every=1))
  config.eval.train_problems = 0
  return config


def _metrics(workdir):
  return [run_dir.without_timings(r) for r in run_dir.read_metrics(str(workdir))]


def _params(workdir, step):
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(str(workdir)))
  restored = ckpt.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  ckpt.close()
  return [np.asarray(x) for x in jax.tree.leaves(restored.params)]


def _signal_at_update(monkeypatch, update: int, count: int = 1):
  """SIGTERM (`count` times) to this process while update `update` (1-based) is built."""
  build, calls = rl_batch.build_train_batch, []

  def build_and_signal(*args, **kwargs):
    calls.append(1)
    if len(calls) == update:
      for _ in range(count):
        os.kill(os.getpid(), signal.SIGTERM)
    return build(*args, **kwargs)

  monkeypatch.setattr(rl_batch, "build_train_batch", build_and_signal)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  workdir = tmp_path_factory.mktemp("preempt") / "full"
  train.run(_micro(), str(workdir))
  return workdir


def test_sigterm_saves_the_step_reached_and_the_rerun_matches(full_run, tmp_path,
                                                               monkeypatch):
  """Two SIGTERMs during step 3 (the second while it finishes and saves): the run ends
  after step 3 with step 3 saved, off the checkpoint_every=2 grid; the rerun resumes
  there and ends with the uninterrupted run's metrics and weights, bit for bit."""
  workdir = tmp_path / "preempted"
  _signal_at_update(monkeypatch, 3, count=2)
  with pytest.raises(preemption.Preempted, match="preempted after 3 steps .* a rerun "
                     "resumes at step 3"):
    train.run(_micro(), str(workdir))
  assert sorted(os.listdir(run_dir.checkpoint_dir(str(workdir)))) == ["2", "3"]
  (event,) = run_dir.read_events(str(workdir))
  assert event["event"] == metrics.EVENT_PREEMPTED and event["step"] == 3
  assert _metrics(workdir) == _metrics(full_run)[:4]   # step 0 (eval) and steps 1-3
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed

  monkeypatch.undo()
  train.run(_micro(), str(workdir))
  assert _metrics(workdir) == _metrics(full_run)
  for got, want in zip(_params(workdir, 4), _params(full_run, 4), strict=True):
    np.testing.assert_array_equal(got, want)


def test_signals_are_logged_by_a_thread_not_inside_the_handler(caplog):
  """A handler that logs can re-enter a stream the interrupted code was writing; the
  notice's handler only records, and every signal is logged, in order, by its own
  thread before the context exits. The previous handler is back afterwards."""
  before = signal.getsignal(signal.SIGTERM)
  with caplog.at_level("WARNING"):
    with preemption.Notice() as notice:
      assert not notice.reached(1)
      os.kill(os.getpid(), signal.SIGTERM)
      os.kill(os.getpid(), signal.SIGTERM)
      assert notice.reached(1) and notice.reached(2)
  lines = [(r.threadName, r.getMessage()) for r in caplog.records
           if "SIGTERM" in r.getMessage()]
  assert lines == [("isojax-preemption-log", "SIGTERM: the run stops after this step and "
                    "saves it"),
                   ("isojax-preemption-log", "SIGTERM again: still finishing the step and "
                    "saving it")]
  assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_before_the_first_step_saves_nothing_and_says_so(tmp_path, monkeypatch):
  load = prompts.load_task

  def load_and_signal(*args, **kwargs):  # during start-up, before anything compiles
    os.kill(os.getpid(), signal.SIGTERM)
    return load(*args, **kwargs)

  monkeypatch.setattr(prompts, "load_task", load_and_signal)
  with pytest.raises(preemption.Preempted, match="after 0 steps .* nothing was saved yet"):
    train.run(_micro(), str(tmp_path / "early"))
  assert not os.listdir(run_dir.checkpoint_dir(str(tmp_path / "early")))
  assert run_dir.read_events(str(tmp_path / "early")) == []


def test_sigterm_during_the_step_0_evaluation_stops_before_step_1(tmp_path, monkeypatch):
  """The signal arrives while the base model is evaluated: the run stops once that
  evaluation is logged, before step 1 is compiled, sampled or trained, saving nothing."""
  evaluate, calls = evaluation.evaluate, []

  def evaluate_and_signal(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return evaluate(*args, **kwargs)

  monkeypatch.setattr(evaluation, "evaluate", evaluate_and_signal)
  monkeypatch.setattr(rl_batch, "build_train_batch", lambda *a, **k: calls.append(1))
  workdir = tmp_path / "eval"
  with pytest.raises(preemption.Preempted, match="after 0 steps .* nothing was saved yet: "
                     "a rerun starts afresh"):
    train.run(_micro(), str(workdir))
  assert calls == []  # no update was built
  assert [r["step"] for r in run_dir.read_metrics(str(workdir))] == [0]
  assert run_dir.read_events(str(workdir)) == []
  assert not os.listdir(run_dir.checkpoint_dir(str(workdir)))


def test_main_exits_0_on_sigterm_with_the_step_saved(tmp_path):
  """The real signal to `python -m isojax.main`: exit status 0 (not 143), a line saying
  where the run resumes, and a checkpoint of that step."""
  workdir = tmp_path / "run"
  proc = subprocess.Popen(
      [sys.executable, "-m", "isojax.main", "--config=configs/easy.py:micro",
       f"--workdir={workdir}", "--config.num_steps=50", "--config.checkpoint_every=50",
       "--config.log_every=1", "--config.eval.train_problems=0"],
      cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    lines = (run_dir.read_metrics(str(workdir))
             if run_dir.metrics_path(str(workdir)).exists() else [])
    if any(r["step"] >= 1 for r in lines):
      break
    time.sleep(0.05)
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=240)
  assert proc.returncode == 0, err[-3000:]
  (event,) = run_dir.read_events(str(workdir))
  step = event["step"]
  assert 1 <= step < 50 and f"preempted after {step} steps (SIGTERM)" in err
  # The step reached, beside step 0's (the state before any update).
  assert sorted(os.listdir(run_dir.checkpoint_dir(str(workdir))), key=int) == ["0", str(step)]
  assert run_dir.read_metrics(str(workdir))[-1]["step"] == step


def test_the_sweep_runner_keeps_a_preempted_run_pending(tmp_path):
  """Exit 0 short of num_steps is pending when the run's last line is a preemption event,
  failed otherwise: no event, or an earlier preemption the run resumed from."""
  step = {"step": 3, "rollouts": 48, "tokens": 100, "wall_s": 1.0, "val/avg@4": 0.5}
  preempted = dict(step, event=metrics.EVENT_PREEMPTED, message="preempted")
  for name, lines, pending in (("preempted", [step, preempted], True),
                               ("short", [step], False),
                               ("resumed", [step, preempted, dict(step, step=4)], False)):
    workdir = tmp_path / "runs" / name
    writer = run_dir.MetricsWriter(str(workdir))
    for line in lines:
      writer.write(line)
    entry = dict(name=name, num_steps=8, state=sweep_layout.RUNNING)
    os.makedirs(workdir, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    sweep = runner.LocalSweep(str(tmp_path), {"runs": [entry]}, None)
    active = runner._Active(sweep, entry, proc, open(workdir / "l", "w"),  # pylint: disable=protected-access
                            open(workdir / runner.LOG_FILE, "w"), time.time())
    os.makedirs(sweep_layout.run_dir_of(str(tmp_path), name), exist_ok=True)
    runner._finish(active)  # pylint: disable=protected-access
    want = sweep_layout.PENDING if pending else sweep_layout.FAILED
    assert entry["state"] == want, entry


# ---------------------------------------------------------------- one writer per workdir

_HOLDER = """
import sys, time
from isojax.run import workdir_lock
with workdir_lock.hold(sys.argv[1]):
  print("held", flush=True)
  time.sleep(600)
"""


def test_a_held_workdir_refuses_a_second_run_naming_the_holder(tmp_path):
  """A second run fails before it loads anything, naming the live holder, even with
  --force_unlock: the holder's pid runs on this host. The holder keeps the workdir."""
  workdir = str(tmp_path / "run")
  holder = subprocess.Popen([sys.executable, "-c", _HOLDER, workdir], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with open(os.path.join(workdir, workdir_lock.LOCK_FILE)) as f:
      token = json.load(f)["token"]
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "isojax.main", "--config=configs/easy.py:micro",
         f"--workdir={workdir}", "--force_unlock"], cwd=ROOT, capture_output=True,
        text=True, timeout=120)
    assert proc.returncode == 1
    assert f"pid {holder.pid} is running on this host" in proc.stderr, proc.stderr[-2000:]
    assert "--force_unlock never takes a workdir from a live run" in proc.stderr
    assert f"`kill -TERM {holder.pid}` on host {socket.gethostname()}" in proc.stderr
    assert time.time() - start < 60  # before loading or compiling anything
    assert not os.path.exists(run_dir.config_path(workdir))  # nothing written
    with open(os.path.join(workdir, workdir_lock.LOCK_FILE)) as f:
      assert json.load(f)["token"] == token  # still the holder's
  finally:
    holder.kill()  # SIGKILL: the kernel releases the lock
    holder.wait()
  with workdir_lock.hold(workdir) as owner:
    assert owner.pid == os.getpid()
    for force in (False, True):
      with pytest.raises(workdir_lock.WorkdirLocked, match=f"pid {os.getpid()} is running"):
        with workdir_lock.hold(workdir, force=force):
          pass
  with workdir_lock.hold(workdir):  # released on exit
    pass


def _dead_pid() -> int:
  proc = subprocess.Popen([sys.executable, "-c", "pass"])
  proc.wait()  # reaped: the pid names no process (until the kernel reuses it)
  return proc.pid


@pytest.fixture
def foreign_lock(tmp_path):
  """`record(**owner_fields)` locks `<workdir>/run.lock` through a descriptor of its own
  (as a holder whose lock another process inherited, or a lost machine's NFS lock)
  with that owner recorded; returns the workdir."""
  import fcntl  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  workdir.mkdir()
  fds = []

  def record(**fields) -> str:
    while fds:  # one foreign holder at a time
      os.close(fds.pop())
    fd = os.open(workdir / workdir_lock.LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fds.append(fd)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    owner = dataclasses.replace(workdir_lock.Owner.me(), token="foreign", **fields)
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(dataclasses.asdict(owner)).encode(), 0)
    return str(workdir)
  yield record
  for fd in fds:
    os.close(fd)


def _forced_token(workdir, **kwargs):
  with workdir_lock.hold(workdir, force=True, **kwargs) as owner:
    with open(os.path.join(workdir, workdir_lock.LOCK_FILE)) as f:
      assert json.load(f)["token"] == owner.token
    # The old holder's lock is on a file that is no longer the workdir's.
    with pytest.raises(workdir_lock.WorkdirLocked, match=f"pid {owner.pid} is running"):
      with workdir_lock.hold(workdir):
        pass
  return owner.token


def test_force_unlock_takes_a_lock_whose_holder_is_gone(foreign_lock):
  """On this host the holder's pid decides: dead, or reused by a process that started
  at another time, is gone; elsewhere, a heartbeat older than the lease."""
  dead = foreign_lock(pid=_dead_pid())
  with pytest.raises(workdir_lock.WorkdirLocked, match="is no longer running on this "
                     "host. That run is gone: pass --force_unlock"):
    with workdir_lock.hold(dead):
      pass
  assert _forced_token(dead)
  assert _forced_token(foreign_lock(pid_start=1))  # our pid, but not our start time
  assert _forced_token(foreign_lock(host="lost-host", pid_space="other",
                                    heartbeat=time.time() - 100), lease_s=60)


def test_force_unlock_refuses_a_live_holder(foreign_lock):
  """Alive here (the recorded pid and start time are this process's), or elsewhere
  with a fresh heartbeat: refused, naming the holder and how to stop it."""
  for fields, evidence in [
      ({}, f"pid {os.getpid()} is running on this host"),
      (dict(host="far-host", pid=7, pid_space="other", heartbeat=time.time() - 10),
       "its heartbeat is 10 s old; a holder on another host counts as live until its "
       "heartbeat is 60 s old")]:
    workdir = foreign_lock(**fields)
    with pytest.raises(workdir_lock.WorkdirLocked) as refused:
      with workdir_lock.hold(workdir, force=True, lease_s=60):
        pass
    message = str(refused.value)
    assert evidence in message and "never takes a workdir from a live run" in message
    pid, host = fields.get("pid", os.getpid()), fields.get("host", socket.gethostname())
    assert f"host {host}, pid {pid}, started " in message
    assert f"`kill -TERM {pid}` on host {host}" in message
    with open(os.path.join(workdir, workdir_lock.LOCK_FILE)) as f:
      assert json.load(f)["token"] == "foreign"  # untouched


def test_a_local_holder_renews_its_heartbeat(tmp_path):
  workdir = str(tmp_path / "run")
  path = os.path.join(workdir, workdir_lock.LOCK_FILE)
  with workdir_lock.hold(workdir, lease_s=0.3) as owner:
    time.sleep(0.5)
    with open(path) as f:
      renewed = json.load(f)
    assert renewed["token"] == owner.token and renewed["heartbeat"] > owner.heartbeat
    assert renewed["pid_start"] == workdir_lock.process_start(os.getpid())[0]
  with open(path) as f:
    assert f.read() == ""  # released


def test_object_store_leases_expire_renew_and_release(fake_gcs):
  del fake_gcs
  workdir = "gs://bucket/run"
  path = workdir + "/" + workdir_lock.LEASE_FILE
  from isojax import storage  # pylint: disable=g-import-not-at-top
  with workdir_lock.hold(workdir, lease_s=0.3) as owner:
    first = storage.read_json(path)
    assert first["token"] == owner.token
    for force in (False, True):  # this process holds it: alive whatever its heartbeat
      with pytest.raises(workdir_lock.WorkdirLocked,
                         match=f"pid {os.getpid()}.* is running on this host"):
        with workdir_lock.hold(workdir, force=force, lease_s=60):
          pass
    time.sleep(0.5)
    assert storage.read_json(path)["heartbeat"] > first["heartbeat"]  # renewed
  assert not storage.path(path).exists()  # released

  # A crashed holder on another host: its lease is not renewed and expires.
  stale = dataclasses.asdict(workdir_lock.Owner("lost-host", 7, "2026-01-01T00:00:00",
                                                "dead", time.time() - 10))
  storage.write_json(path, stale)
  for force in (False, True):  # fresh: refused, forced or not
    with pytest.raises(workdir_lock.WorkdirLocked, match="host lost-host, pid 7.*10 s old"):
      with workdir_lock.hold(workdir, force=force, lease_s=60):
        pass
  with workdir_lock.hold(workdir, lease_s=5) as owner:  # not renewed for 10 s > 5 s
    assert storage.read_json(path)["token"] == owner.token
  # A holder on this host whose pid is gone: --force_unlock need not wait for expiry.
  me = workdir_lock.Owner.me()
  storage.write_json(path, dict(dataclasses.asdict(me), pid=_dead_pid(), token="gone"))
  with pytest.raises(workdir_lock.WorkdirLocked, match="That run is gone: pass --force"):
    with workdir_lock.hold(workdir, lease_s=60):
      pass
  with workdir_lock.hold(workdir, force=True, lease_s=60) as owner:
    assert storage.read_json(path)["token"] == owner.token
