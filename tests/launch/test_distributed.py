"""isojax.distributed: environment -> jax.distributed.initialize, and 2 real processes."""

import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from isojax import distributed

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXPLICIT = {"ISOJAX_COORDINATOR": "node-a:12345", "ISOJAX_NUM_PROCESSES": "4",
            "ISOJAX_PROCESS_ID": "3"}


def test_no_variables_means_one_process():
  assert distributed.initialize_kwargs({}) is None
  assert distributed.initialize_kwargs({"ISOJAX_DISTRIBUTED": "", "PATH": "/bin"}) is None
  assert distributed.initialize({}) is False


def test_explicit_coordinates():
  assert distributed.initialize_kwargs(EXPLICIT) == dict(
      coordinator_address="node-a:12345", num_processes=4, process_id=3)


def test_auto_detection():
  assert distributed.initialize_kwargs({"ISOJAX_DISTRIBUTED": "auto"}) == {}
  assert distributed.initialize_kwargs({"ISOJAX_DISTRIBUTED": "AUTO"}) == {}


@pytest.mark.parametrize("env,message", [
    ({**EXPLICIT, "ISOJAX_PROCESS_ID": "4"}, r"ISOJAX_PROCESS_ID=4: expected in \[0, 4\)"),
    ({**EXPLICIT, "ISOJAX_PROCESS_ID": "-1"}, "ISOJAX_PROCESS_ID=-1"),
    ({**EXPLICIT, "ISOJAX_NUM_PROCESSES": "two"}, "ISOJAX_NUM_PROCESSES='two'"),
    ({**EXPLICIT, "ISOJAX_NUM_PROCESSES": "0"}, "ISOJAX_NUM_PROCESSES=0"),
    ({**EXPLICIT, "ISOJAX_COORDINATOR": "node-a"}, "expected host:port"),
    ({**EXPLICIT, "ISOJAX_COORDINATOR": "node-a:port"}, "expected host:port"),
    ({"ISOJAX_COORDINATOR": "node-a:1"}, "ISOJAX_NUM_PROCESSES, ISOJAX_PROCESS_ID missing"),
    ({"ISOJAX_PROCESS_ID": "0"}, "ISOJAX_COORDINATOR, ISOJAX_NUM_PROCESSES missing"),
    ({**EXPLICIT, "ISOJAX_DISTRIBUTED": "auto"}, "both set"),
    ({"ISOJAX_DISTRIBUTED": "yes"}, "ISOJAX_DISTRIBUTED='yes'"),
])
def test_bad_environment_names_the_variable(env, message):
  with pytest.raises(ValueError, match=message):
    distributed.initialize_kwargs(env)


_WORKER = r"""
import json, sys
from isojax import distributed
assert distributed.initialize()
import jax, jax.numpy as jnp
result = {"process_count": jax.process_count(), "process_index": jax.process_index(),
          "devices": jax.device_count(), "local_devices": jax.local_device_count()}
print(json.dumps(result), flush=True)
from jax.experimental import multihost_utils
try:
  gathered = multihost_utils.process_allgather(jnp.array([jax.process_index() + 10]))
  result["gathered"] = gathered.reshape(-1).tolist()
except Exception as e:  # pylint: disable=broad-except
  result["collective_error"] = repr(e)
print(json.dumps(result), flush=True)
"""


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_cpu_processes_initialise_from_the_environment(tmp_path):
  script = tmp_path / "worker.py"
  script.write_text(_WORKER)
  coordinator = f"localhost:{_free_port()}"
  procs = []
  for process_id in range(2):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISOJAX_")}
    env.update(ISOJAX_COORDINATOR=coordinator, ISOJAX_NUM_PROCESSES="2",
               ISOJAX_PROCESS_ID=str(process_id), JAX_PLATFORMS="cpu",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    procs.append(subprocess.Popen([sys.executable, str(script)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  results = []
  for proc in procs:
    try:
      out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      pytest.fail("the two processes did not finish within 120 s")
    assert proc.returncode == 0, err[-3000:]
    results.append(json.loads(out.strip().splitlines()[-1]))
  assert [r["process_index"] for r in results] == [0, 1]
  assert all(r["process_count"] == 2 and r["devices"] == 2 * r["local_devices"]
             for r in results)
  if any("collective_error" in r for r in results):
    pytest.skip(f"CPU collectives unavailable here: {results[0].get('collective_error')}")
  assert all(r["gathered"] == [10, 11] for r in results)


def _start_two(workdir, num_steps: int) -> list[subprocess.Popen]:
  coordinator = f"localhost:{_free_port()}"
  procs = []
  for process_id in range(2):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISOJAX_")}
    env.update(ISOJAX_COORDINATOR=coordinator, ISOJAX_NUM_PROCESSES="2",
               ISOJAX_PROCESS_ID=str(process_id), JAX_PLATFORMS="cpu")
    procs.append(subprocess.Popen(
        [sys.executable, "-m", "isojax.main", "--config=configs/easy.py:micro",
         f"--workdir={workdir}", f"--config.num_steps={num_steps}",
         "--config.checkpoint_every=100", "--config.log_every=1",
         "--config.eval.train_problems=0"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  return procs


def _wait(procs) -> list[str]:
  errs = []
  for proc in procs:
    try:
      _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
      for p in procs:
        p.kill()
      pytest.fail("the two processes did not finish within 300 s")
    assert proc.returncode == 0, err[-3000:]
    errs.append(err)
  return errs


@pytest.mark.slow("two jax.distributed processes train, are preempted and resume")
def test_sigterm_to_one_host_stops_both_at_the_same_step_saved(tmp_path):
  """JAX's preemption service: process 1 alone gets the SIGTERM; both processes stop at
  one step, that step is saved, both exit 0, and the rerun of both completes the run."""
  import time  # pylint: disable=g-import-not-at-top
  from isojax import run_dir  # pylint: disable=g-import-not-at-top
  workdir = tmp_path / "run"
  procs = _start_two(workdir, num_steps=12)
  deadline = time.time() + 240
  while time.time() < deadline and all(p.poll() is None for p in procs):
    if run_dir.metrics_path(str(workdir)).exists() and any(
        r["step"] >= 2 for r in run_dir.read_metrics(str(workdir))):
      break
    time.sleep(0.1)
  procs[1].send_signal(signal.SIGTERM)
  errs = _wait(procs)
  steps = [int(re.search(r"preempted after (\d+) steps", err).group(1)) for err in errs]
  assert steps[0] == steps[1] and 2 <= steps[0] < 12, steps
  # The step reached, beside step 0's (the state before any update).
  assert sorted(os.listdir(run_dir.checkpoint_dir(str(workdir))), key=int) == [
      "0", str(steps[0])]
  (event,) = run_dir.read_events(str(workdir))
  assert event["step"] == steps[0]

  _wait(_start_two(workdir, num_steps=12))
  assert [r["step"] for r in run_dir.read_metrics(str(workdir))] == list(range(13))
