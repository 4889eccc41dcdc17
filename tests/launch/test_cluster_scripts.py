"""The generated SLURM array script and TPU-VM commands: their text, and what they run.

The scripts are executed with stand-ins for `srun`, `scontrol`, `gcloud` and `python`
on PATH that record how they were called, so the tests check what a scheduler would
launch: which plan an array index runs, one process per node, the jax.distributed
coordinates each process gets.
"""

import json
import os
import re
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _generate(out, *flags):
  """`launch.sweep` run from outside the checkout, as an installed package runs it."""
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  proc = subprocess.run(
      [sys.executable, "-m", "launch.sweep", "--config=configs/sweep_hard.py:micro",
       f"--out={out}", *flags], cwd=os.path.dirname(out), env=env, capture_output=True,
      text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  with open(os.path.join(out, "sweep.json")) as f:
    manifest = json.load(f)
  return proc, [os.path.join(out, e["plan"]) for e in manifest["runs"]]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  out = tmp_path_factory.mktemp("slurm_sweep")
  proc, plans = _generate(out, "--backend=slurm", "--slurm_nodes=2",
                          "--slurm_gpus_per_node=8", "--slurm_time=01:00:00")
  with open(out / "sweep.slurm") as f:
    return out, proc, plans, f.read()


def _shims(tmp_path):
  """srun (runs its command once per task, as SLURM_PROCID 0..N-1), scontrol, python
  and gcloud stand-ins that append their arguments and ISOJAX_* env to calls.jsonl."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  record = (f'{sys.executable} -c "import json, os, sys; print(json.dumps(dict(tool=sys.argv[1], '
            f'args=sys.argv[2:], env={{k: v for k, v in os.environ.items() '
            f'if k.startswith(\'ISOJAX_\')}})))" ')
  shims = {
      "srun": record + 'srun "$@" >> "$CALLS"\n'
              'while [[ "$1" == --* ]]; do shift; done\n'
              'for ((id = 0; id < SLURM_NTASKS; id++)); do\n'
              '  SLURM_PROCID=$id "$@" || exit $?\n'
              'done\n',
      "scontrol": '[ "$1 $2" = "show hostnames" ] && printf "node-a\\nnode-b\\n"\n',
      "python": record + 'python "$@" >> "$CALLS"\n',
      "gcloud": record + 'gcloud "$@" >> "$CALLS"\n',
  }
  for name, body in shims.items():
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return bin_dir


def _run_script(script, tmp_path, **env):
  bin_dir = tmp_path / "bin" if (tmp_path / "bin").exists() else _shims(tmp_path)
  calls = tmp_path / "calls.jsonl"
  if calls.exists():
    calls.unlink()
  full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "CALLS": str(calls),
              **env}
  proc = subprocess.run(["bash", str(script)], env=full_env, capture_output=True, text=True,
                        timeout=60)
  lines = calls.read_text().splitlines() if calls.exists() else []
  return proc, [json.loads(line) for line in lines]


def test_slurm_script_text(slurm):
  out, proc, plans, text = slurm
  assert len(plans) == 3
  assert re.search(r"^#SBATCH --array=0-2$", text, re.M)  # one task per run
  for option in ("--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--time=01:00:00",
                 "--signal=TERM@300"):
    assert re.search(rf"^#SBATCH {re.escape(option)}$", text, re.M), option
  assert "srun " in text and "--ntasks-per-node=1" in text.split("srun ", 1)[1]
  assert "scontrol show hostnames \"$SLURM_JOB_NODELIST\"" in text
  for var in ("ISOJAX_COORDINATOR", "ISOJAX_NUM_PROCESSES", "ISOJAX_PROCESS_ID"):
    assert var in text
  # runs.txt: line i + 1 is array task i's plan, in manifest order.
  with open(out / "runs.txt") as f:
    assert f.read().splitlines() == plans
  assert f"sbatch {out}/sweep.slurm" in proc.stdout


def test_slurm_array_task_runs_its_plan_on_every_node_with_coordinates(slurm, tmp_path):
  out, _, plans, _ = slurm
  proc, calls = _run_script(
      out / "sweep.slurm", tmp_path, SLURM_ARRAY_TASK_ID="1", SLURM_NTASKS="2",
      SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="node-[a-b]", SLURM_JOB_ID="12345")
  assert proc.returncode == 0, proc.stderr
  srun = [c for c in calls if c["tool"] == "srun"]
  python = [c for c in calls if c["tool"] == "python"]
  assert len(srun) == 1 and "--ntasks-per-node=1" in srun[0]["args"]
  assert len(python) == 2  # one process per node
  for process_id, call in enumerate(python):
    assert call["args"] == ["-m", "isojax.main", f"--config=configs/from_json.py:{plans[1]}",
                            f"--workdir={os.path.dirname(plans[1])}"]
    assert call["env"] == {"ISOJAX_COORDINATOR": f"node-a:{20000 + 12345 % 20000}",
                           "ISOJAX_NUM_PROCESSES": "2", "ISOJAX_PROCESS_ID": str(process_id)}


def test_slurm_single_node_runs_without_distributed_env(tmp_path):
  out = tmp_path / "sweep"
  _, plans = _generate(out, "--backend=slurm")
  text = (out / "sweep.slurm").read_text()
  assert re.search(r"^#SBATCH --nodes=1$", text, re.M) and "--gpus-per-node" not in text
  for task in range(3):
    proc, calls = _run_script(out / "sweep.slurm", tmp_path, SLURM_ARRAY_TASK_ID=str(task),
                              SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
                              SLURM_JOB_NODELIST="node-a", SLURM_JOB_ID="7")
    assert proc.returncode == 0, proc.stderr
    (python,) = [c for c in calls if c["tool"] == "python"]
    assert python["args"][2] == f"--config=configs/from_json.py:{plans[task]}"
    assert python["env"] == {}
  # An index past the list is an error, not a silent no-op.
  proc, calls = _run_script(out / "sweep.slurm", tmp_path, SLURM_ARRAY_TASK_ID="3",
                            SLURM_NTASKS="1", SLURM_JOB_NUM_NODES="1",
                            SLURM_JOB_NODELIST="node-a", SLURM_JOB_ID="7")
  assert proc.returncode != 0 and "no line 4" in proc.stderr and not calls


def test_tpu_commands_run_every_plan_on_all_workers(tmp_path):
  out = tmp_path / "sweep"
  proc, plans = _generate(out, "--backend=tpu")
  script = out / "tpu_commands.sh"
  text = script.read_text()
  assert text.count("gcloud compute tpus tpu-vm ssh") == 3
  assert "TPU_NAME=<tpu> ZONE=<zone> bash" in proc.stdout
  proc, calls = _run_script(script, tmp_path, TPU_NAME="my-tpu", ZONE="us-central2-b",
                            REPO_DIR="/opt/isojax")
  assert proc.returncode == 0, proc.stderr
  assert len(calls) == 3
  for call, plan in zip(calls, plans):
    args = call["args"]
    assert args[:6] == ["compute", "tpus", "tpu-vm", "ssh", "my-tpu", "--zone=us-central2-b"]
    assert "--worker=all" in args
    (command,) = [a for a in args if a.startswith("--command=")]
    assert command == (f"--command=cd /opt/isojax && ISOJAX_DISTRIBUTED=auto python -m "
                       f"isojax.main --config=configs/from_json.py:{plan} "
                       f"--workdir={os.path.dirname(plan)}")
  # Without REPO_DIR each host runs the isojax installed there, from its home directory.
  proc, calls = _run_script(script, tmp_path, TPU_NAME="my-tpu", ZONE="us-central2-b")
  assert proc.returncode == 0, proc.stderr
  assert [a for a in calls[0]["args"] if a.startswith("--command=")] == [
      f"--command=ISOJAX_DISTRIBUTED=auto python -m isojax.main "
      f"--config=configs/from_json.py:{plans[0]} --workdir={os.path.dirname(plans[0])}"]
  # Without the TPU's name the script stops before running anything.
  proc, calls = _run_script(script, tmp_path, ZONE="us-central2-b")
  assert proc.returncode != 0 and "TPU_NAME" in proc.stderr and not calls
