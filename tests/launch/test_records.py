"""A sweep's records carried to a fresh directory: the relaunch there runs only what
had not finished, and the finished runs keep their finals.

A stand-in for `isojax.main` writes what a real run writes (config.json from its plan,
metrics.jsonl, checkpoints, a log); the n = 4 run stops half-way, as a machine that
goes down does.
"""

import json
import os
import subprocess
import sys

import pytest

from isojax.sweeps import manifest as sweep_manifest
from isojax.sweeps import records
from isojax.sweeps import runner as sweep_runner
from isojax.sweeps import sweep_config

import stand_in_main  # tests/launch/stand_in_main.py, beside this file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_FAKE = r"""
import json, os, sys
plan, workdir, record = sys.argv[1:]
with open(plan) as f:
  config = json.load(f)
with open(record, "a") as f:
  f.write(os.path.basename(workdir) + "\n")
with open(os.path.join(workdir, "config.json"), "w") as f:
  json.dump(config, f)
n, steps = config["rollouts_per_problem"], config["num_steps"]
last = steps // 2 if n == 4 else steps
for step in (0, last):
  os.makedirs(os.path.join(workdir, "checkpoints", str(step)), exist_ok=True)
with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
  for step in range(last + 1):
    f.write(json.dumps({"step": step, "rollouts": step * n * 4, "tokens": 0, "wall_s": 0.0,
                        "val/avg@4": n / 100 + step / 1000}) + "\n")
print("a log line")
sys.exit(3 if n == 4 else 0)
"""


@pytest.fixture
def fake_main(tmp_path, monkeypatch):
  return stand_in_main.use(tmp_path, monkeypatch, _FAKE)


def _sweep():
  return sweep_config.load_config_file("configs/sweep_hard.py:micro")


def _run(out):
  manifest = sweep_manifest.prepare(_sweep(), out, "local")
  sweep_runner.run_local(out, manifest, workers=2, cache_dir=None, poll_s=0.05,
                         finished_checkpoints="all")
  return {e["name"]: e for e in sweep_manifest.read_manifest(out)["runs"]}


def _files(root):
  return sorted(os.path.relpath(os.path.join(d, f), root)
                for d, _, files in os.walk(root) for f in files)


def test_records_carry_finished_runs_and_the_relaunch_runs_only_the_rest(tmp_path,
                                                                         fake_main):
  out = str(tmp_path / "machine_a")
  entries = _run(out)
  assert {e["state"] for e in entries.values()} == {"done", "failed"}
  # What a study directory holds besides its runs.
  os.makedirs(os.path.join(out, "jax_cache"))
  open(os.path.join(out, "jax_cache", "xla_entry"), "w").close()
  open(os.path.join(out, "curves.png"), "w").close()
  with open(os.path.join(out, "profile_partial.json"), "w") as f:
    json.dump({"passes": {"train": {"0": [1, 2]}}}, f)

  saved = str(tmp_path / "repo" / "records")
  copied = records.copy(out, saved)
  kept_run_files = ("config.json", "metrics.jsonl", "plan.json")
  want = sorted(["profile_partial.json", "sweep.json", "runs/bp4_n4/plan.json"] +
                [os.path.join("runs", name, f) for name in ("bp4_n2", "bp4_n8")
                 for f in kept_run_files])
  assert _files(saved) == want
  assert copied.finished_runs == ["runs/bp4_n2", "runs/bp4_n8"]
  assert copied.unfinished_runs == ["runs/bp4_n4"]
  for rel in want:
    with open(os.path.join(out, rel), "rb") as a, open(os.path.join(saved, rel), "rb") as b:
      assert a.read() == b.read(), rel
  assert records.copy(out, saved).files == copied.files  # again: nothing changes
  assert _files(saved) == want
  # The unfinished run's plan is what restarts it: a plan changed since (a re-plan)
  # replaces the copy, so a restore never starts it from a stale one.
  replanned = os.path.join(out, "runs", "bp4_n4", "plan.json")
  with open(replanned) as f:
    old_plan = json.load(f)
  for plan_now in (dict(old_plan, seed=7), old_plan):
    with open(replanned, "w") as f:
      json.dump(plan_now, f)
    records.copy(out, saved)
    with open(os.path.join(saved, "runs", "bp4_n4", "plan.json")) as f:
      assert json.load(f) == plan_now

  # A fresh machine: restored, the relaunch starts only the run that had not finished
  # (failed there, as the manifest records), and the restored runs' finals are the ones
  # measured on the first.
  fresh = str(tmp_path / "machine_b")
  records.copy(saved, fresh)
  fake_main.write_text("")
  manifest = sweep_manifest.prepare(_sweep(), fresh, "local")
  states = {e["name"]: (e["state"], e["final"]) for e in manifest["runs"]}
  assert states == {"bp4_n2": ("done", entries["bp4_n2"]["final"]),
                    "bp4_n4": ("failed", None),
                    "bp4_n8": ("done", entries["bp4_n8"]["final"])}
  sweep_runner.run_local(fresh, manifest, workers=2, cache_dir=None, poll_s=0.05)
  assert fake_main.read_text().split() == ["bp4_n4"]


def test_a_copy_over_a_run_going_on_or_into_itself_is_refused_before_any_write(
    tmp_path, fake_main):
  out = str(tmp_path / "a")
  _run(out)
  busy = str(tmp_path / "b")
  os.makedirs(os.path.join(busy, "runs", "bp4_n8", "checkpoints", "3"))
  with open(os.path.join(busy, "runs", "bp4_n8", "metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 0, "rollouts": 0, "tokens": 0, "wall_s": 0.0}) + "\n")
  with pytest.raises(records.RecordsError, match=r"b/runs/bp4_n8: holds checkpoints"):
    records.copy(out, busy)
  assert _files(busy) == ["runs/bp4_n8/metrics.jsonl"]
  with pytest.raises(records.RecordsError, match="one lies inside the other"):
    records.copy(out, os.path.join(out, "saved"))
  with pytest.raises(records.RecordsError, match="one lies inside the other"):
    records.copy(out, str(tmp_path))
  with pytest.raises(records.RecordsError, match="not a directory"):
    records.copy(str(tmp_path / "missing"), busy)


def test_the_command_copies_and_names_what_it_left_out(tmp_path, fake_main):
  out = str(tmp_path / "a")
  _run(out)
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  done = subprocess.run([sys.executable, "-m", "launch.records", f"--from={out}",
                         f"--to={tmp_path / 'saved'}"], cwd=REPO, env=env,
                        capture_output=True, text=True, check=True)
  assert "2 finished runs copied" in done.stdout and "left out: runs/bp4_n4" in done.stdout
  refused = subprocess.run([sys.executable, "-m", "launch.records", f"--from={out}",
                            f"--to={out}/inside"], cwd=REPO, env=env, capture_output=True,
                           text=True)
  assert refused.returncode == 1 and "launch.records: --from=" in refused.stderr
