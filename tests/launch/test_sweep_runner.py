"""The local worker pool and the manifest, with a stand-in for `isojax.main`.

The stand-in writes a finished metrics.jsonl (or fails, for one run), so these tests
pin the scheduling logic in seconds: failures are recorded and do not stop the others,
at most `workers` runs at once, a run held by another process is not started twice,
and a changed plan is refused.
"""

import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import threading

import ml_collections
import pytest

from isojax import run_dir
from isojax.planner import analysis, findings
from isojax.sweeps import sweep_analysis
from isojax.sweeps import sweep_config
from isojax.sweeps import layout as sweep_layout
from isojax.sweeps import manifest as sweep_manifest
from isojax.sweeps import plan as sweep_plan
from isojax.sweeps import runner as sweep_runner
from isojax.sweeps import study as study_lib

import stand_in_main  # tests/launch/stand_in_main.py, beside this file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Stand-in run: sleeps, writes metrics up to num_steps with val/avg@4 = n / 100, and
# records how many stand-ins were running at once; the n = 4 run fails instead.
_FAKE = r"""
import json, os, sys, time
plan, workdir, record = sys.argv[1:]
with open(plan) as f:
  config = json.load(f)
with open(record, "a") as f:
  f.write(f"start {os.path.basename(workdir)} {time.time()}\n")
time.sleep(0.3)
for step in (0, config["num_steps"] // 2, config["num_steps"]):  # saved checkpoints
  os.makedirs(os.path.join(workdir, "checkpoints", str(step)), exist_ok=True)
if config["rollouts_per_problem"] == 4:
  print("boom: this run fails")
  sys.exit(3)
n, steps = config["rollouts_per_problem"], config["num_steps"]
with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
  for step in range(steps + 1):
    f.write(json.dumps({"step": step, "rollouts": step * n * 4, "tokens": 0, "wall_s": 0.0,
                        "val/avg@4": n / 100}) + "\n")
with open(record, "a") as f:
  f.write(f"end {os.path.basename(workdir)} {time.time()}\n")
"""


@pytest.fixture
def fake_main(tmp_path, monkeypatch):
  return stand_in_main.use(tmp_path, monkeypatch, _FAKE)


def _sweep(**fields):
  sweep = sweep_config.load_config_file("configs/sweep_hard.py:micro")
  sweep.update(fields)
  return sweep


def _intervals(record):
  events = [line.split() for line in record.read_text().splitlines()]
  starts = {name: float(t) for kind, name, t in events if kind == "start"}
  ends = {name: float(t) for kind, name, t in events if kind == "end"}
  return starts, ends


def test_failures_are_recorded_and_do_not_stop_the_others(tmp_path, fake_main):
  out = str(tmp_path / "sweep")
  manifest = sweep_manifest.prepare(_sweep(), out, "local")
  assert [e["name"] for e in manifest["runs"]] == ["bp4_n2", "bp4_n4", "bp4_n8"]
  failed = sweep_runner.run_local(out, manifest, workers=1, cache_dir=None, poll_s=0.05)
  assert failed == ["bp4_n4"]
  with open(os.path.join(out, "sweep.json")) as f:
    runs = {e["name"]: e for e in json.load(f)["runs"]}
  assert runs["bp4_n4"]["state"] == "failed" and runs["bp4_n4"]["returncode"] == 3
  assert "exit status 3" in runs["bp4_n4"]["error"] and "boom" in runs["bp4_n4"]["error"]
  for name, n in (("bp4_n2", 2), ("bp4_n8", 8)):
    assert runs[name]["state"] == "done" and runs[name]["final"] == {"val/avg@4": n / 100}
  # With one worker the runs never overlap.
  starts, ends = _intervals(fake_main)
  assert starts["bp4_n8"] >= ends["bp4_n2"]

  # Rerunning retries only the failed run.
  manifest = sweep_manifest.prepare(_sweep(), out, "local")
  fake_main.write_text("")
  assert sweep_runner.run_local(out, manifest, workers=2, cache_dir=None,
                                poll_s=0.05) == ["bp4_n4"]
  starts, _ = _intervals(fake_main)
  assert list(starts) == ["bp4_n4"] and manifest["runs"][1]["attempts"] == 2


def test_workers_run_in_parallel_and_a_locked_run_waits(tmp_path, fake_main):
  out = str(tmp_path / "sweep")
  manifest = sweep_manifest.prepare(_sweep(), out, "local")
  # Another process holds bp4_n8 and finishes it while this launcher waits.
  workdir = sweep_layout.run_dir_of(out, "bp4_n8")  # prepare() made it (plan.json)
  holder = open(os.path.join(workdir, sweep_runner.LOCK_FILE), "w")
  fcntl.flock(holder.fileno(), fcntl.LOCK_EX)

  manifest["runs"][2].update(pid=999999)  # a dead launcher's record of it

  def finish_elsewhere():
    with open(run_dir.metrics_path(workdir), "w") as f:
      for step in range(manifest["runs"][2]["num_steps"] + 1):
        f.write(json.dumps({"step": step, "rollouts": 0, "tokens": 0, "wall_s": 1.5 * step,
                            "val/avg@4": 0.5}) + "\n")
    holder.close()
  timer = threading.Timer(1.0, finish_elsewhere)
  timer.start()
  failed = sweep_runner.run_local(out, manifest, workers=2, cache_dir=None, poll_s=0.05)
  timer.join()
  assert failed == ["bp4_n4"]
  starts, ends = _intervals(fake_main)
  assert "bp4_n8" not in starts  # never started here
  assert starts["bp4_n4"] < ends["bp4_n2"]  # the two workers overlapped
  entry = manifest["runs"][2]
  assert entry["state"] == "done" and entry["final"] == {"val/avg@4": 0.5}
  # Finished elsewhere: no stale pid; its wall seconds and end from the run's own files.
  assert entry["pid"] is None and entry["returncode"] == 0
  assert entry["wall_s"] == 1.5 * entry["num_steps"] and entry["finished"]


def test_a_sigterm_just_after_a_start_stops_that_worker_too(tmp_path, fake_main,
                                                            monkeypatch):
  """The signal lands right after `Popen` returns, before the run is tracked: the
  launcher still stops that worker, waits for it and marks its run pending."""
  out = str(tmp_path / "sweep")
  manifest = sweep_manifest.prepare(_sweep(), out, "local")
  started = []
  real_popen = sweep_runner.subprocess.Popen

  def popen_then_signal(*args, **kwargs):
    proc = real_popen(*args, **kwargs)
    started.append(proc)
    os.kill(os.getpid(), signal.SIGTERM)
    return proc
  monkeypatch.setattr(sweep_runner.subprocess, "Popen", popen_then_signal)
  before = signal.getsignal(signal.SIGTERM)
  with pytest.raises(sweep_runner.Interrupted, match="SIGTERM"):
    sweep_runner.run_local(out, manifest, workers=1, cache_dir=None, poll_s=0.05)
  assert len(started) == 1
  assert started[0].returncode is not None  # waited for, not left running
  with open(os.path.join(out, "sweep.json")) as f:
    states = [e["state"] for e in json.load(f)["runs"]]
  assert states == ["pending"] * 3
  assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back



def test_sweeps_in_one_pool_leave_no_worker_waiting_for_a_sweeps_last_run(tmp_path,
                                                                         fake_main):
  """Two sweeps of three runs on two workers: the first sweep's runs start first, and
  its last run shares the pool with the second sweep's first (a pool per sweep would
  start that one only after the last had ended). Each sweep keeps its own manifest."""
  local = [sweep_runner.LocalSweep(out, sweep_manifest.prepare(sweep, out, "local"), None)
           for sweep, out in ((_sweep(), str(tmp_path / "a")),
                              (_sweep(name="b", problems_range=(2, 2)), str(tmp_path / "b")))]
  failed = sweep_runner.run_local_sweeps(local, workers=2, poll_s=0.05)
  assert failed == [["bp4_n4"], ["bp2_n4"]]
  starts, ends = _intervals(fake_main)
  assert max(starts["bp4_n2"], starts["bp4_n4"]) < min(
      starts[n] for n in ("bp2_n2", "bp2_n4", "bp2_n8"))
  assert starts["bp2_n2"] < ends["bp4_n8"]
  for sweep in local:
    with open(os.path.join(sweep.out_dir, "sweep.json")) as f:
      on_disk = {e["name"]: e["state"] for e in json.load(f)["runs"]}
    assert on_disk == {e["name"]: e["state"] for e in sweep.manifest["runs"]}
    assert sorted(on_disk.values()) == ["done", "done", "failed"]


def test_a_study_checks_every_sweep_before_any_run_and_runs_them_in_one_pool(
    tmp_path, fake_main, monkeypatch):
  sweeps = ["configs/sweep_hard.py:micro", "configs/sweep_easy.py:micro"]
  with pytest.raises(sweep_config.SweepError, match="its runs use the profiled split"):
    study_lib.run(str(tmp_path / "bad"), profile_config="", workers=2,
                  sweeps=[sweeps[0], "configs/sweep_smollm2_hard.py"],
                  options_from_dir=None)
  assert not fake_main.exists()  # nothing ran
  pools = []
  real = sweep_runner.run_local_sweeps
  monkeypatch.setattr(sweep_runner, "run_local_sweeps",
                      lambda local, **kw: pools.append(local) or real(local, **kw))
  study = study_lib.run(str(tmp_path / "study"), profile_config="", workers=2,
                        sweeps=sweeps, options_from_dir=None)
  assert [[os.path.basename(s.out_dir) for s in pool] for pool in pools] == [
      list(study["sweeps"])]
  assert len(study["sweeps"]) == 2
  for entry in study["sweeps"].values():
    assert entry["num_runs"] == 3 and entry["failed"] == ["bp4_n4"]
    # Not analysed, and no verdicts, while a run has failed.
    assert "analysis" not in entry and "bp4_n4 have failed" in entry["analysis_error"]
  assert "findings" not in study
  assert not (tmp_path / "study" / "findings.md").exists()
  assert not any((tmp_path / "study" / s / "experiment.json").exists()
                 for s in study["sweeps"])



def test_a_study_whose_analysis_fails_writes_no_findings(tmp_path, monkeypatch):
  """Every run finished but one sweep's analysis failed: the findings table would read
  the other sweep's experiment.json alone (or one an earlier analysis left), so it is
  not written, and study.json names the failed analysis."""
  monkeypatch.setattr(sweep_runner, "run_local_sweeps",
                      lambda local, **kw: [[] for _ in local])  # every run finished

  analysed = []

  def analyze(out_dir, sweep):  # the first sweep's analysis fails, the second's succeeds
    del sweep
    analysed.append(out_dir)
    if len(analysed) == 1:
      raise analysis.AnalysisError("no finite metric")
    return {}
  monkeypatch.setattr(sweep_analysis, "analyze", analyze)
  monkeypatch.setattr(sweep_analysis, "format_analysis", lambda summary: "")
  written = []
  monkeypatch.setattr(findings, "write_study_findings",
                      lambda study_dir, **kw: written.append(study_dir) or ([], ""))
  study = study_lib.run(str(tmp_path / "study"), profile_config="", workers=2,
                        sweeps=["configs/sweep_hard.py:micro", "configs/sweep_easy.py:micro"],
                        options_from_dir=None)
  errors = {name: e.get("analysis_error") for name, e in study["sweeps"].items()}
  assert sorted(e is None for e in errors.values()) == [False, True], errors
  assert written == [] and "findings" not in study
  with open(tmp_path / "study" / study_lib.STUDY_FILE) as f:
    assert "no finite metric" in json.dumps(json.load(f))


def _steps(out, name):
  return sorted(os.listdir(os.path.join(out, "runs", name, "checkpoints")), key=int)


def test_a_finished_run_keeps_only_its_last_checkpoint_unless_asked_for_all(tmp_path,
                                                                         fake_main):
  """Each run saves steps 0, M // 2 and M: a finished one keeps M, a failed one all
  three; with finished_checkpoints='all' every run keeps all. A run finished before the
  launch is pruned when the launcher finds it, unless another process holds it."""
  kept = str(tmp_path / "all")
  manifest = sweep_manifest.prepare(_sweep(), kept, "local")
  sweep_runner.run_local(kept, manifest, workers=2, cache_dir=None, poll_s=0.05,
                         finished_checkpoints="all")
  steps = {e["name"]: e["num_steps"] for e in manifest["runs"]}
  for name, m in steps.items():
    assert _steps(kept, name) == ["0", str(m // 2), str(m)]

  out = str(tmp_path / "last")
  manifest = sweep_manifest.prepare(_sweep(), out, "local")
  sweep_runner.run_local(out, manifest, workers=2, cache_dir=None, poll_s=0.05)
  assert _steps(out, "bp4_n2") == [str(steps["bp4_n2"])]
  assert _steps(out, "bp4_n8") == [str(steps["bp4_n8"])]
  assert _steps(out, "bp4_n4") == ["0", str(steps["bp4_n4"] // 2), str(steps["bp4_n4"])]

  # The "all" sweep relaunched with the default: its finished runs are pruned, except
  # the one another process holds.
  holder = open(os.path.join(sweep_layout.run_dir_of(kept, "bp4_n8"), sweep_runner.LOCK_FILE),
                "w")
  fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
  partial = os.path.join(kept, "runs", "bp4_n2", "checkpoints", "9.orbax-checkpoint-tmp-17")
  os.makedirs(partial)
  fake_main.write_text("")
  manifest = sweep_manifest.prepare(_sweep(), kept, "local")
  with pytest.raises(sweep_config.SweepError, match="finished_checkpoints='none'"):
    sweep_runner.run_local(kept, manifest, workers=2, cache_dir=None,
                           finished_checkpoints="none")
  sweep_runner.run_local(kept, manifest, workers=2, cache_dir=None, poll_s=0.05)
  holder.close()
  assert _steps(kept, "bp4_n2") == [str(steps["bp4_n2"])] and not os.path.exists(partial)
  assert _steps(kept, "bp4_n8") == ["0", str(steps["bp4_n8"] // 2), str(steps["bp4_n8"])]


def test_a_changed_plan_is_refused_and_worker_env(tmp_path):
  out = str(tmp_path / "sweep")
  sweep_manifest.prepare(_sweep(), out, "local")
  with pytest.raises(sweep_config.SweepError, match=r"bp4_n2/plan.json.*eval.every"):
    sweep_manifest.prepare(_sweep(evals_per_run=2), out, "local")
  # A plan written before a field existed is the same plan when the field keeps its
  # default (from_json fills it in); given another value, it is a change.
  path = os.path.join(out, "runs", "bp4_n2", "plan.json")
  with open(path) as f:
    older = json.load(f)
  del older["model"]["lora"]
  with open(path, "w") as f:
    json.dump(older, f)
  sweep_manifest.prepare(_sweep(), out, "local")
  lora = _sweep()
  lora.overrides.model = ml_collections.ConfigDict(dict(lora=dict(rank=2)))
  with pytest.raises(sweep_config.SweepError, match=r"bp4_n2/plan.json.*model\.lora\.rank"):
    sweep_manifest.prepare(lora, out, "local")
  env = sweep_runner.worker_env(2, "/tmp/cache", base={
      "XLA_FLAGS": "--xla_foo=1", "JAX_COMPILATION_CACHE_DIR": "/tmp/elsewhere"})
  assert env["XLA_FLAGS"] == "--xla_foo=1 --xla_cpu_multi_thread_eigen=false"
  assert env["JAX_COMPILATION_CACHE_DIR"] == "/tmp/cache"   # the sweep's flag wins
  assert "JAX_COMPILATION_CACHE_DIR" not in sweep_runner.worker_env(
      1, "", base={"JAX_COMPILATION_CACHE_DIR": "/tmp/elsewhere"})   # '' disables
  assert "XLA_FLAGS" not in sweep_runner.worker_env(1, None, base={})


def test_sweep_overrides_go_through_the_config_layer():
  sweep = _sweep()
  sweep.overrides.rl = ml_collections.ConfigDict(dict(klcoef=0.1))
  with pytest.raises(sweep_config.SweepError, match=r"^sweep config overrides: unknown "
                     r"field\(s\) rl\.klcoef \(did you mean rl\.kl_coef\?\)$"):
    sweep_config.base_run_config(sweep)
  sweep.overrides.rl = ml_collections.ConfigDict(dict(kl_coef=0.25))
  sweep.overrides.base_model = ml_collections.ConfigDict(dict(path="/tmp/models/qwen"))
  base = sweep_config.base_run_config(sweep)
  # configs/hard.py:micro (micro preset: 4 rollouts, 3 steps) with the two overrides.
  assert (base.rl.kl_coef, base.base_model.path, base.task.split) == (
      0.25, "/tmp/models/qwen", "")
  assert (base.rollouts_per_problem, base.num_steps) == (4, 3)
  with pytest.raises(sweep_config.SweepError, match=r"config file 'configs/nope\.py' does "
                     "not exist"):
    sweep_config.load_config_file("configs/nope.py:micro")


def _finished(out, name, steps):
  with open(os.path.join(out, "runs", name, "metrics.jsonl"), "w") as f:
    for step in range(steps + 1):
      f.write(json.dumps({"step": step, "rollouts": 0, "tokens": 0, "wall_s": 0.0,
                          "val/avg@4": 0.5}) + "\n")


def test_an_extension_rewrites_only_plans_cut_shorter_and_resumes_them_allowed(tmp_path):
  out = str(tmp_path / "sweep")
  manifest = sweep_manifest.prepare(_sweep(budget_rollouts=128), out, "local")
  steps = {e["name"]: e["num_steps"] for e in manifest["runs"]}
  for name, m in steps.items():
    _finished(out, name, m)
  plans = {n: open(sweep_layout.plan_path(out, n)).read() for n in steps}
  # Twice the budget: refused as it was, with the way on named; nothing is rewritten.
  with pytest.raises(sweep_config.SweepError, match=r"--extend\) from 16 to 32 steps"):
    sweep_manifest.prepare(_sweep(budget_rollouts=256), out, "local")
  with pytest.raises(sweep_config.SweepError, match="--backend=local"):
    sweep_manifest.prepare(_sweep(budget_rollouts=256), out, "tpu", extend=True)
  # Another change beside the length is no extension.
  other = _sweep(budget_rollouts=256)
  other.overrides.optim = ml_collections.ConfigDict(dict(learning_rate=0.5))
  with pytest.raises(sweep_config.SweepError, match="optim.learning_rate"):
    sweep_manifest.prepare(other, out, "local", extend=True)
  # A shorter budget is not one either.
  with pytest.raises(sweep_config.SweepError, match="num_steps"):
    sweep_manifest.prepare(_sweep(budget_rollouts=64), out, "local", extend=True)
  assert {n: open(sweep_layout.plan_path(out, n)).read() for n in steps} == plans
  manifest = sweep_manifest.prepare(_sweep(budget_rollouts=256), out, "local", extend=True)
  for e in manifest["runs"]:
    plan = json.load(open(sweep_layout.plan_path(out, e["name"])))
    assert plan["num_steps"] == 2 * steps[e["name"]] == e["num_steps"]
    assert plan["budget_rollouts"] == 256 and e["state"] == "pending"
    assert e["allow_changed"] == ["num_steps", "eval.every"]
    cmd = sweep_runner.main_command("p.json", "w", allow_changed=e["allow_changed"])
    assert cmd[-1] == "--allow_changed=num_steps,eval.every"
  # Rerun (a launcher that stopped before the runs resumed): the allowance stays.
  again = sweep_manifest.prepare(_sweep(budget_rollouts=256), out, "local", extend=True)
  assert [e["allow_changed"] for e in again["runs"]] == [["num_steps", "eval.every"]] * 3
  assert sweep_runner.main_command("p.json", "w")[-1] == "--workdir=w"
  # Denser evaluations may come with a longer plan, never alone.
  denser = _sweep(budget_rollouts=512, evals_per_run=8)
  with pytest.raises(sweep_config.SweepError, match="eval.count"):
    sweep_manifest.prepare(_sweep(budget_rollouts=256, evals_per_run=8), out, "local",
                       extend=True)
  manifest = sweep_manifest.prepare(denser, out, "local", extend=True)
  for e in manifest["runs"]:
    plan = json.load(open(sweep_layout.plan_path(out, e["name"])))
    assert (plan["num_steps"], plan["eval"]["count"]) == (4 * steps[e["name"]], 8)
    # eval.every = M // evals_per_run: 4M // 8 = 2M // 4, unchanged.
    assert e["allow_changed"] == ["num_steps", "eval.count"]


def test_an_extension_that_would_extend_nothing_is_refused_before_anything_is_written(
    tmp_path):
  """Replicate seeds name the runs: extending without them plans runs the directory does
  not hold (bp8_n2 beside bp8_n2_s0, ...) and would train them from step 0."""
  out = str(tmp_path / "sweep")
  seeded = sweep_manifest.prepare(_sweep(budget_rollouts=128, seeds=(0, 1)), out, "local")
  names = sorted(e["name"] for e in seeded["runs"])
  assert all(n.endswith(("_s0", "_s1")) for n in names)
  before = sorted(os.listdir(os.path.join(out, "runs")))
  with pytest.raises(sweep_config.SweepError, match=r"none of the runs planned .* holds "
                     + re.escape(", ".join(names))):
    sweep_manifest.prepare(_sweep(budget_rollouts=256), out, "local", extend=True)
  assert sorted(os.listdir(os.path.join(out, "runs"))) == before
  # With the seeds it was made with, the same extension goes ahead.
  extended = sweep_manifest.prepare(_sweep(budget_rollouts=256, seeds=(0, 1)), out, "local",
                                    extend=True)
  assert sorted(e["name"] for e in extended["runs"]) == names


def test_a_study_sets_every_sweeps_budget_evaluations_and_seeds_over_its_own(tmp_path):
  spec = "configs/sweep_hard.py:micro"
  own = sweep_config.load_config_file(spec)
  assert study_lib.load_sweep(spec).to_dict() == own.to_dict()
  overrides = study_lib.Overrides(budget=4 * own.budget_rollouts, evals_per_run=24)
  sweep = study_lib.load_sweep(spec, overrides)
  assert (sweep.budget_rollouts, sweep.evals_per_run) == (4 * own.budget_rollouts, 24)
  out = str(tmp_path / "sweep")
  sweep_manifest.prepare(study_lib.load_sweep(spec), out, "local")
  manifest = sweep_manifest.prepare(sweep, out, "local", extend=True)
  counts = {json.load(open(sweep_layout.plan_path(out, e["name"])))["eval"]["count"]
            for e in manifest["runs"]}
  assert counts == {24} and all("eval.count" in e["allow_changed"] for e in manifest["runs"])
  with pytest.raises(sweep_config.SweepError, match="evals_per_run=-1: expected >= 1"):
    study_lib.Overrides(evals_per_run=-1)
  # Replicate seeds: every allocation once per seed, each run with its seed.
  seeded = study_lib.load_sweep(spec, study_lib.Overrides(seeds=(0, 1, 2)))
  planned = sweep_plan.plan_runs(seeded)
  allocations = {r.name.rsplit("_s", 1)[0] for r in planned}
  assert len(planned) == 3 * len(allocations) == 3 * len(sweep_plan.plan_runs(own))
  assert sorted((r.name.rsplit("_s", 1)[0], r.config["seed"]) for r in planned) == sorted(
      (a, s) for a in allocations for s in (0, 1, 2))
  manifest = sweep_manifest.prepare(seeded, str(tmp_path / "seeded"), "local")
  assert sorted(e["seed"] for e in manifest["runs"]) == sorted([0, 1, 2] * len(allocations))
  assert manifest["total_rollouts"] == sum(r.allocation.rollouts for r in planned) == (
      3 * sum(r.allocation.rollouts for r in sweep_plan.plan_runs(own)))
  for bad, why in (((0, 0), "distinct"), ((1, -1), "non-negative")):
    with pytest.raises(sweep_config.SweepError, match=why):
      study_lib.Overrides(seeds=bad)
  # The command refuses bad flags before profiling anything.
  for flag, message in (("--evals_per_run=-1", "evals_per_run=-1: expected >= 1"),
                        ("--seeds=0,x", "--seeds=0,x: expected non-negative integers"),
                        ("--seeds=1,1", "expected distinct seeds")):
    proc = subprocess.run([sys.executable, "-m", "launch.study", f"--out={tmp_path / 'study'}",
                           flag], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, (flag, proc.stderr[-500:])
    assert not (tmp_path / "study").exists()


def test_a_split_is_the_same_split_when_it_holds_the_same_problems(tmp_path):
  def write(directory, meta, train):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "hard.json"), "w") as f:
      json.dump(dict(name="hard", meta=meta, train=train, val=[{"prompt": "1+1="}]), f)
  write(tmp_path / "a", {"model": "/here"}, [{"prompt": "2+2="}])
  write(tmp_path / "b", {"model": "/there"}, [{"prompt": "2+2="}])  # profiled elsewhere
  write(tmp_path / "c", {"model": "/here"}, [{"prompt": "3+3="}])
  plan = lambda d: {"task.splits_dir": str(tmp_path / d), "task.split": "hard"}
  same = sweep_manifest._same_split  # pylint: disable=protected-access
  assert same(plan("a"), plan("a")) and same(plan("a"), plan("b"))
  assert not same(plan("a"), plan("c")) and not same(plan("a"), plan("missing"))
