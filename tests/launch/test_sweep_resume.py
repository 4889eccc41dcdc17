"""A killed local sweep, rerun with the same command, ends as an uninterrupted one.

The micro sweep (3 runs of the micro model) is killed (launcher and workers, SIGKILL
to the process group, as a crash would) after one run has finished and another has
written a checkpoint but not finished, then resumed; each run the kill left partial is
then run afresh from its plan as the uninterrupted reference.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from isojax import run_dir
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import manifest as sweep_manifest
from isojax.sweeps import runner as sweep_runner

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _command(out, jax_cache):
  # budget 256: bp4_n2 (M = 32), bp4_n4 (M = 16), bp4_n8 (M = 8), a checkpoint every
  # M // 4 steps, so a run stays partially done long enough to be caught. The suite's
  # compilation cache (tests/conftest.py), where there is one, serves every sweep here.
  jax_cache = os.environ.get("JAX_COMPILATION_CACHE_DIR", jax_cache)
  return [sys.executable, "-m", "launch.sweep", "--config=configs/sweep_hard.py:micro",
          f"--out={out}", "--workers=2", f"--compilation_cache={jax_cache}",
          "--config.budget_rollouts=256"]


def _metrics(out, name):
  return run_dir.read_metrics(os.path.join(out, "runs", name))


def _without_wall(lines):
  return [run_dir.without_timings(line) for line in lines]


def _progress(out, runs):
  """(finished runs, runs with a checkpoint that have not finished)."""
  finished, partial = [], []
  for name, steps in runs.items():
    workdir = os.path.join(out, "runs", name)
    try:
      lines = run_dir.read_metrics(workdir)
    except run_dir.RunFormatError:
      lines = []
    if lines and lines[-1]["step"] == steps:
      finished.append(name)
      continue
    ckpt = os.path.join(workdir, "checkpoints")
    saved = [int(d) for d in os.listdir(ckpt) if d.isdigit()] if os.path.isdir(ckpt) else []
    if any(0 < s < steps for s in saved):
      partial.append(name)
  return finished, partial


@pytest.mark.slow("a micro sweep killed and rerun, as subprocesses")
def test_killed_sweep_resumes_without_redoing_finished_runs(tmp_path):
  jax_cache = tmp_path / "jax_cache"
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))

  # Kill the launcher and its workers once a run is finished and another is half done.
  out = tmp_path / "killed"
  launcher = subprocess.Popen(_command(out, jax_cache), cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
  deadline = time.time() + 240
  runs, finished, partial = {}, [], []
  while time.time() < deadline and launcher.poll() is None:
    try:
      with open(out / "sweep.json") as f:
        runs = {e["name"]: e["num_steps"] for e in json.load(f)["runs"]}
    except (FileNotFoundError, json.JSONDecodeError):
      time.sleep(0.05)
      continue
    finished, partial = _progress(out, runs)
    if finished and partial:
      break
    time.sleep(0.05)
  os.killpg(launcher.pid, signal.SIGKILL)
  launcher.wait()
  assert runs == {"bp4_n2": 32, "bp4_n4": 16, "bp4_n8": 8}
  finished, partial = _progress(out, runs)  # as the kill left them
  if not (finished and partial):
    pytest.fail(f"could not catch the sweep with a finished and a partial run "
                f"(finished {finished}, partial {partial})")
  kept = {name: (os.stat(out / "runs" / name / "metrics.jsonl").st_mtime_ns,
                 (out / "runs" / name / "metrics.jsonl").read_bytes()) for name in finished}

  # The same command again.
  proc = subprocess.run(_command(out, jax_cache), cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  for name in finished:  # not redone: the files are untouched and it ran once
    path = out / "runs" / name / "metrics.jsonl"
    assert (os.stat(path).st_mtime_ns, path.read_bytes()) == kept[name], name
    assert (out / "runs" / name / "log.txt").read_text().count("=== attempt") == 1
    assert f"skipping {name}: finished" in proc.stderr
  for name in partial:  # relaunched, and resumed from its checkpoint
    log = (out / "runs" / name / "log.txt").read_text()
    assert log.count("=== attempt") == 2 and "resumed" in log, name

  # A resumed run ends as the same run never interrupted: each partial one's plan run
  # afresh, as a sweep worker runs it (the finished ones were never interrupted).
  reference = tmp_path / "reference"
  worker_env = sweep_runner.worker_env(2, os.environ.get("JAX_COMPILATION_CACHE_DIR"),
                                       base=env)
  references = {name: subprocess.Popen(
      sweep_runner.main_command(sweep_layout.plan_path(str(out), name), str(reference / name)),
      cwd=tmp_path, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
      text=True) for name in partial}
  for name, ref in references.items():
    _, stderr = ref.communicate(timeout=300)
    assert ref.returncode == 0, stderr[-3000:]
    want = _without_wall(run_dir.read_metrics(str(reference / name)))
    assert _without_wall(_metrics(out, name)) == want, name
  with open(out / "sweep.json") as f:
    manifest = {e["name"]: e for e in json.load(f)["runs"]}
  for name in runs:
    assert manifest[name]["state"] == "done"
    if name not in finished:  # the killed launcher may not have seen the others' exit
      assert manifest[name]["returncode"] == 0
    assert manifest[name]["final"] == sweep_manifest.final_metrics(
        str(out / "runs" / name), runs[name])
  for name in partial:
    assert manifest[name]["final"] == sweep_manifest.final_metrics(str(reference / name),
                                                               runs[name])
  for sub in ("", "best@4", "worst@4"):
    for name in ("analysis.json", "metric_vs_compute.png", "n_star.png", "views.png"):
      assert os.path.getsize(out / sub / name) > 1000, (sub, name)
  with open(out / "analysis.json") as f:
    assert len(json.load(f)["fits"]) >= 2


@pytest.mark.slow("a micro sweep as a subprocess")
def test_sigterm_stops_the_runs_and_leaves_them_pending(tmp_path):
  """SIGTERM to the launcher alone (as a scheduler's preemption sends it): it stops its
  workers, marks their runs pending in the manifest and exits 0 (as isojax.main does
  when preempted) with the resume hint."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  out = tmp_path / "sweep"
  launcher = subprocess.Popen(_command(out, tmp_path / "jax_cache"), cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
  deadline = time.time() + 240
  while time.time() < deadline and launcher.poll() is None:
    try:
      with open(out / "sweep.json") as f:
        if any(e["state"] == "running" for e in json.load(f)["runs"]):
          break
    except (FileNotFoundError, json.JSONDecodeError):
      pass
    time.sleep(0.05)
  assert launcher.poll() is None, "the sweep ended before a run was started"
  launcher.send_signal(signal.SIGTERM)
  _, stderr = launcher.communicate(timeout=120)
  assert launcher.returncode == 0, stderr[-3000:]
  assert ("launch.sweep: interrupted (SIGTERM): the running runs saved the step they "
          "reached and are pending; rerun the same command to resume") in stderr, stderr[-3000:]
  with open(out / "sweep.json") as f:
    states = {e["name"]: e["state"] for e in json.load(f)["runs"]}
  assert "running" not in states.values() and "pending" in states.values(), states
  # No worker outlived the launcher. A worker's own helpers (a forkserver, the resource
  # tracker) exit when they see it gone, a moment later; zombies waiting for a reaper
  # that is not there are not running.
  deadline = time.time() + 30
  while _live_members(launcher.pid) and time.time() < deadline:
    time.sleep(0.2)
  assert not _live_members(launcher.pid)


def _live_members(pgid):
  """The processes of group `pgid` that are not zombies, as (pid, command)."""
  live = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        command = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
      continue
    state, _, group = stat.rsplit(")", 1)[1].split()[:3]
    if int(group) == pgid and state != "Z":
      live.append((int(pid), command[:200]))
  return live
