"""isojax.reproduce (behind launch.reproduce): the result tables, from small synthetic run
directories, and the binary's flag checks."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from isojax.reproduce import demos, isa, off_policy, runs as runs_lib, tables

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_run(path, *, seed, counts, num_samples=8, num_steps=4, wall_s=12.5,
               step_line=None):
  """A finished run's config.json and metrics.jsonl: evaluations at steps 0 and num_steps."""
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(dict(seed=seed, num_steps=num_steps, eval=dict(num_samples=num_samples)), f)
  lines = []
  for step, c in zip((0, num_steps), counts):
    c = np.asarray(c)
    lines.append({"step": step, "rollouts": 8 * step, "tokens": 40 * step, "wall_s": wall_s * step / num_steps,
                  "val/avg@4": float(c.mean() / num_samples),
                  "val/avg@4_stderr": float((c / num_samples).std(ddof=1) / np.sqrt(c.size)),
                  "val/best@4": 0.5 + step / 100, "val/worst@4": step / 100,
                  "val/correct_counts": c.tolist(),
                  "train/pass@1_histogram": [3 - step // num_steps, 1, step // num_steps]})
    if step < num_steps:
      lines.append({"step": step + 1, "rollouts": 8, "tokens": 40, "wall_s": 1.0,
                    "train/reward": 0.5, **(step_line or {})})
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.write("\n".join(json.dumps(r) for r in lines) + "\n")


def test_paired_gain_matches_a_direct_computation():
  before, after = [0, 2, 4, 8], [2, 2, 8, 8]
  gain, se = runs_lib.paired_gain(before, after, num_samples=8)
  diffs = [0.25, 0.0, 0.5, 0.0]
  mean = sum(diffs) / 4
  var = sum((d - mean) ** 2 for d in diffs) / 3
  assert gain == pytest.approx(mean)
  assert se == pytest.approx((var / 4) ** 0.5)
  with pytest.raises(ValueError, match="at least 2 problems"):
    runs_lib.paired_gain([1], [2], 8)


def test_demo_table_from_synthetic_runs(tmp_path):
  rng = np.random.default_rng(0)
  before = rng.integers(0, 4, 64)
  after = np.minimum(before + rng.integers(0, 3, 64), 8)
  _write_run(tmp_path / "hard_s0", seed=0, counts=(before, after))
  _write_run(tmp_path / "hard_s1", seed=1, counts=(after, before), wall_s=75)
  runs = {"hard": [runs_lib.summarize_run(str(tmp_path / f"hard_s{s}")) for s in (0, 1)]}
  table = demos.table(runs)
  rows = [line for line in table.splitlines() if line.startswith("| hard |")]
  assert len(rows) == 4  # two metric rows, two histogram rows
  cells = [c.strip() for c in rows[0].strip("|").split("|")]
  gain = (after - before).mean() / 8
  se = ((after - before) / 8).std(ddof=1) / np.sqrt(64)
  assert cells[2] == f"{before.mean() / 8:.3f} +- {(before / 8).std(ddof=1) / 8:.3f}"
  assert cells[3].startswith(f"{after.mean() / 8:.3f} +- ")
  assert cells[4] == f"{gain:+.3f}" and cells[5] == f"{gain / se:.1f}"
  assert cells[6] == "0.500 -> 0.540" and cells[8] == "4" and cells[9] == "12 s"
  second = [c.strip() for c in rows[1].strip("|").split("|")]
  assert second[4] == f"{-gain:+.3f}" and second[9] == "1 min 15 s"
  assert "| hard | 0 | `[3, 1, 0]` | `[2, 1, 1]` |" in table
  # The wall time this command measured wins over the run's own clock.
  with open(tmp_path / "hard_s0" / runs_lib.TIMING_FILE, "w") as f:
    json.dump(dict(wall_s=130.2), f)
  assert runs_lib.summarize_run(str(tmp_path / "hard_s0"))["wall_s"] == 130.2


def test_unfinished_runs_are_refused(tmp_path):
  _write_run(tmp_path / "run", seed=0, counts=([1, 2], [2, 3]), num_steps=4)
  config = json.loads((tmp_path / "run" / "config.json").read_text())
  config["num_steps"] = 10
  (tmp_path / "run" / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="last evaluation at step 4.*10 steps: unfinished"):
    runs_lib.summarize_run(str(tmp_path / "run"))


def test_a_finished_run_is_reused_only_under_the_settings_it_ran_with(tmp_path, monkeypatch):
  """The run's config.json as isojax.main writes it for configs/hard.py:micro at seed 1
  (its preset's fields, the seed, then the derived M): reused as it is for the same
  command; a changed field or seed is refused, naming the field and both values,
  before anything runs."""
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.configs import hard  # pylint: disable=g-import-not-at-top
  made = hard.get_config("micro")
  made.seed = 1
  workdir = tmp_path / "run"
  _write_run(workdir, seed=1, counts=([1, 2], [2, 3]), num_steps=made.num_steps)
  (workdir / "config.json").write_text(json.dumps(config_lib.resolve(made).to_dict()))
  monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("a run started"))
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="")
  assert runs_lib.run_main(inv, "configs/hard.py:micro", str(workdir), "1") == 12.5
  with pytest.raises(runs_lib.StaleRun, match=r"optim.learning_rate \S+ -> 0.5; remove it"):
    runs_lib.run_main(inv, "configs/hard.py:micro", str(workdir), "1",
                      ["--config.optim.learning_rate=0.5"])
  with pytest.raises(runs_lib.StaleRun, match="seed 1 -> 2"):
    runs_lib.run_main(inv, "configs/hard.py:micro", str(workdir), "2")



@pytest.mark.slow("a micro run as a subprocess")
def test_a_run_that_finishes_keeps_only_its_newest_checkpoint(tmp_path):
  """configs/hard.py:micro checkpointing every step: of the steps it saved, the last
  stays, as a sweep's finished runs keep it."""
  from isojax import run_dir  # pylint: disable=g-import-not-at-top
  from isojax.configs import hard  # pylint: disable=g-import-not-at-top
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="")
  workdir = str(tmp_path / "run")
  runs_lib.run_main(inv, "configs/hard.py:micro", workdir, "0",
                    ["--config.checkpoint_every=1", "--config.checkpoint_keep=3"])
  steps = hard.get_config("micro").num_steps
  assert run_dir.read_metrics(workdir)[-1]["step"] == steps
  assert os.listdir(run_dir.checkpoint_dir(workdir)) == [str(steps)]


def test_the_smollm2_candidates_cache_is_reused_only_under_its_settings(tmp_path,
                                                                       monkeypatch):
  """candidates.json is read back when it holds the candidates' settings as resolved
  now; an older cache (no settings) or one made under another config is measured again
  (here: the measurement is stubbed to fail, so reaching it shows the cache was not used)."""
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.configs import smollm2 as smollm2_config  # pylint: disable=g-import-not-at-top
  from isojax.reproduce import smollm2  # pylint: disable=g-import-not-at-top
  from isojax.run import resume_check, run_inputs  # pylint: disable=g-import-not-at-top

  def measured(*a, **k):
    raise RuntimeError("measured again")
  monkeypatch.setattr(run_inputs, "policy_path", measured)
  settings = []
  for _, fields in smollm2.SMOLLM2_CANDIDATES:
    config = smollm2_config.get_config()
    config.task.update(**fields)
    settings.append(resume_check.dotted_fields(config_lib.resolve(config)))
  rows = [dict(name="x", avg=0.1, se=0.01, solved=0.2)]
  cache = tmp_path / "smollm2" / "candidates.json"
  cache.parent.mkdir()
  cache.write_text(json.dumps(dict(rows=rows, wall_s=5.0, settings=settings)))
  assert smollm2.base_candidates(str(tmp_path)) == (rows, 5.0)
  settings[0]["task.num_val"] += 1
  for stale in (dict(rows=rows, wall_s=5.0, settings=settings), dict(rows=rows, wall_s=5.0)):
    cache.write_text(json.dumps(stale))
    with pytest.raises(RuntimeError, match="measured again"):
      smollm2.base_candidates(str(tmp_path))


def test_written_file_carries_the_header_and_replaces_the_old(tmp_path, monkeypatch):
  env = dict(commit="abc123def456", dirty=False, cpu="Test CPU", cpus=2, host_isa="AVX512",
             isa="AVX2", accelerator="none", jax="0.10.2", python="3.11.7",
             date="2026-01-02 03:04 UTC")
  monkeypatch.setattr(tables, "environment", lambda repo: env)
  (tmp_path / "demos.md").write_text("old table\n")
  inv = tables.Invocation(out=str(tmp_path / "runs"), results=str(tmp_path), repo=ROOT,
                          command="python -m launch.reproduce")
  path = tables.write(inv, "demos.md", "Title", 3725.0, "body\n")
  text = open(path).read()
  assert "old table" not in text
  assert text.startswith("# Title\n")
  assert "`python -m launch.reproduce`" in text
  row = next(line for line in text.splitlines() if line.startswith("| abc123def456"))
  assert row == ("| abc123def456 | Test CPU (2 cores, host AVX512) | AVX2 | none | 0.10.2 | "
                 "2026-01-02 03:04 UTC | 1 h 2 min |")
  assert text.rstrip().endswith("body")


def test_environment_names_this_checkout_and_machine():
  env = tables.environment(ROOT)
  assert re.fullmatch(r"[0-9a-f]{12}|unknown", env["commit"])
  assert env["cpus"] == os.cpu_count()
  import jax  # pylint: disable=g-import-not-at-top
  assert env["jax"] == jax.__version__


def test_demo_plot_is_written(tmp_path):
  _write_run(tmp_path / "r", seed=0, counts=([1, 2, 3], [2, 3, 4]))
  runs = {"hard": [runs_lib.summarize_run(str(tmp_path / "r"))]}
  demos.plot(runs, str(tmp_path / "img" / "demos.png"))
  with open(tmp_path / "img" / "demos.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_figures_leave_pyplots_backend_and_figures_alone(tmp_path):
  """A section's figure from a notebook: the session keeps its backend and has no new
  pyplot figure (the figures are drawn outside pyplot)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  before = matplotlib.get_backend()
  matplotlib.use("svg")
  try:
    _write_run(tmp_path / "r", seed=0, counts=([1, 2, 3], [2, 3, 4]))
    demos.plot({"hard": [runs_lib.summarize_run(str(tmp_path / "r"))]},
               str(tmp_path / "img" / "demos.png"))
    assert matplotlib.get_backend() == "svg" and not plt.get_fignums()
  finally:
    matplotlib.use(before)
  with open(tmp_path / "img" / "demos.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_first_difference_ignores_timings():
  a = [dict(step=0, wall_s=1.0, x=1), dict(step=1, wall_s=2.0, x=2, **{"time/step_s": 1.0}),
       dict(step=2, wall_s=3.0, x=3)]
  same = [dict(r, wall_s=r["wall_s"] * 2) for r in a]
  # The memory fields follow the machine (its memory sizes the plan), like the timings.
  same[0]["memory/planned_peak_gib"] = 3.5
  same[1]["memory/device_peak_gib"] = 70.0
  assert isa.first_difference(a, same) is None
  other = [dict(r) for r in a]
  other[2]["x"] = 4
  assert isa.first_difference(a, other) == 2
  assert isa.first_difference(a, a[:2]) == 2
  assert isa.first_difference(a, other, prefix="val/") is None


def test_isa_table_names_where_each_cap_departs(tmp_path):
  for cap, after in (("AVX2", [2, 3, 5]), ("AVX", [2, 4, 5])):
    _write_run(tmp_path / cap, seed=0, counts=([1, 2, 3], after))
  from isojax import run_dir  # pylint: disable=g-import-not-at-top
  runs = {cap: run_dir.read_metrics(str(tmp_path / cap)) for cap in ("AVX2", "AVX")}
  summaries = {cap: runs_lib.summarize_run(str(tmp_path / cap)) for cap in runs}
  rows = isa.table(runs, summaries).splitlines()[2:]
  assert rows[0].startswith("| AVX2 | 0.250 +- ") and rows[0].count("| none |") == 1
  assert rows[0].split("|")[5:7] == [" none ", " none "]
  assert rows[1].startswith("| AVX | ")
  assert rows[1].split("|")[5:7] == [" 4 ", " 4 "]  # the final evaluation, both columns


def test_off_policy_table_and_plot_from_synthetic_runs(tmp_path):
  counts = (np.arange(16) % 3, np.arange(16) % 5)
  timing = {"time/step_s": 2.0, "time/update_s": 0.5}
  _write_run(tmp_path / "sync", seed=0, counts=counts,
             step_line=dict(timing, **{"time/sample_s": 1.0, "time/grade_wait_s": 0.25}))
  _write_run(tmp_path / "k2", seed=0, counts=counts[::-1], wall_s=8.0, step_line=dict(
      timing, **{"time/rollout_wait_s": 0.125, "train/staleness_max": 2}))
  runs = {name: [off_policy.summarize(str(tmp_path / d))]
          for name, d in (("synchronous", "sync"), ("pipeline, k = 2", "k2"))}
  rows = [[c.strip() for c in line.strip("|").split("|")]
          for line in off_policy.table(runs).splitlines()[2:]]
  assert rows[0][:7] == ["synchronous", f"{counts[1].mean() / 8:.3f}",
                         f"{counts[1].mean() / 8:.3f}", runs_lib.gain_in_se(runs["synchronous"][0]),
                         "0.0", "1.250 s", "0.500 s"]
  assert rows[1][4:6] == ["2.0", "0.125 s"] and rows[1][8] == "8 s"
  off_policy.plot(runs, str(tmp_path / "img" / "off_policy.png"))
  assert os.path.getsize(tmp_path / "img" / "off_policy.png") > 1000


def test_off_policy_fit_recovers_a_known_sigmoid():
  """Two seeds whose mean follows R(C) = 0.1 + 0.3 / (1 + (2000 / C)^1.5) exactly."""
  compute = np.arange(0, 10001, 500)
  curve = 0.1 + 0.3 / (1 + (2000 / np.maximum(compute, 1e-9)) ** 1.5)
  noise = 0.01 * np.sin(compute)
  rows = [{"rollout_curve": list(zip(compute, curve + sign * noise))} for sign in (1, -1)]
  fit = off_policy.fit_setting(rows)
  assert fit.a == pytest.approx(0.4, abs=1e-4) and fit.b == pytest.approx(1.5, abs=1e-3)
  assert fit.c_mid == pytest.approx(2000, rel=1e-3) and fit.r0 == pytest.approx(0.1, abs=1e-4)
  table = off_policy.fits_table({"pipeline, k = 2": rows})
  assert "| pipeline, k = 2 | 0.100 | 0.400 +- " in table and "| 2,000 |" in table


def _binary(*args):
  return subprocess.run([sys.executable, "-m", "launch.reproduce", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)


def test_the_binary_rejects_unknown_sections_and_seeds():
  proc = _binary("--sections=demos,bogus")
  assert proc.returncode != 0 and "--sections: unknown ['bogus']" in proc.stderr
  proc = _binary("--seeds=0,x")
  assert proc.returncode != 0 and "--seeds=0,x: expected non-negative integers" in proc.stderr
  proc = _binary("--saturation_budgets=65536")
  assert proc.returncode != 0 and "expected integers above --study_budget=65536" in proc.stderr


def test_the_study_section_writes_its_table_after_the_primary_sweeps(tmp_path, monkeypatch):
  """The primary sweeps run with every seed, and their table is written before the
  secondary sweeps start: an interrupted section still leaves the primary verdicts."""
  from isojax.reproduce import study
  monkeypatch.setattr(tables, "environment", lambda repo: dict(
      commit="abc", dirty=False, cpu="c", cpus=2, host_isa="x", isa="x", accelerator="none",
      jax="0", python="3", date="d"))
  calls = []

  def fake_launch(inv, study_dir, budget, sweeps, flags=()):
    calls.append((tuple(sweeps), tuple(flags)))
    os.makedirs(study_dir, exist_ok=True)
    if len(calls) == 2:  # the secondary sweeps: the primary table is already there
      assert "the other sweeps not yet run" in open(tmp_path / "study.md").read()
      raise runs_lib.StudyFailed("interrupted")
    return "# Findings\n\nprimary rows\n", 60.0

  monkeypatch.setattr(runs_lib, "launch_study", fake_launch)
  inv = tables.Invocation(out=str(tmp_path / "runs"), results=str(tmp_path), repo=ROOT,
                          command="python -m launch.reproduce")
  with pytest.raises(runs_lib.StudyFailed):
    study.run(inv, 65536, ["0", "1", "2"])
  assert calls == [(study.PRIMARY, ("--seeds=0,1,2",)), (study.SECONDARY, ())]
  text = open(tmp_path / "study.md").read()
  assert "primary rows" in text and "seeds 0, 1, 2 for every allocation" in text


def test_a_study_that_exits_0_without_a_new_summary_was_stopped(tmp_path, monkeypatch):
  """launch.study exits 0 on SIGTERM (preempted, runs pending): without a study.json
  written by this invocation the section stops instead of reading a stale table."""
  study_dir = tmp_path / "study"
  study_dir.mkdir()
  (study_dir / "study.json").write_text("{}")          # from an earlier invocation
  (study_dir / "findings.md").write_text("stale\n")
  os.utime(study_dir / "study.json", (1, 1))
  monkeypatch.setattr(runs_lib.subprocess, "Popen", lambda *a, **k: _Exits(0))
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  with pytest.raises(runs_lib.StudyFailed, match="stopped before it finished"):
    runs_lib.launch_study(inv, str(study_dir), 64)

  def finished(*a, **k):
    (study_dir / "study.json").write_text("{}")
    return _Exits(0)
  monkeypatch.setattr(runs_lib.subprocess, "Popen", finished)
  assert runs_lib.launch_study(inv, str(study_dir), 64)[0] == "stale\n"


class _Exits:
  """A child process that exits with `code` after `waits` timed-out waits (`on_wait` is
  called at each wait, before it times out or returns)."""

  def __init__(self, code, waits=0, on_wait=lambda: None):
    self.returncode, self.waits, self.on_wait = None, waits, on_wait
    self.code, self.killed = code, False

  def kill(self):
    self.killed, self.waits = True, 0

  def wait(self, timeout=None):
    self.on_wait()
    if self.waits:
      self.waits -= 1
      raise subprocess.TimeoutExpired("launch.study", timeout)
    self.returncode = self.code
    return self.code


def test_a_study_invocation_saves_its_wall_time_while_it_runs(tmp_path, monkeypatch):
  """The section's wall time counts an invocation killed part-way (a shutdown stops
  the reproduce command too): the sum over invocations is saved while the study runs,
  not only when it returns."""
  timing = tmp_path / runs_lib.TIMING_FILE
  timing.write_text(json.dumps(dict(wall_s=1000.0)))   # an earlier invocation's
  seen = []
  saved = lambda: seen.append(json.loads(timing.read_text())["wall_s"])
  monkeypatch.setattr(runs_lib, "TIMING_EVERY_S", 0.01)
  monkeypatch.setattr(runs_lib.subprocess, "Popen",
                      lambda *a, **k: _Exits(3, waits=2, on_wait=saved))
  start = time.time()
  code, wall_s = runs_lib._run_timed(["launch.study"], str(tmp_path), str(timing))
  elapsed = time.time() - start
  assert code == 3
  # Before the first wait: the earlier sum; after each timed-out wait, more than it.
  assert seen[0] == 1000.0 and 1000.0 < seen[1] <= seen[2] <= 1000.0 + elapsed
  assert wall_s == json.loads(timing.read_text())["wall_s"]
  assert seen[2] <= wall_s <= 1000.0 + elapsed

  # The time cannot be saved (here: an interrupt while writing it): the study is
  # killed, not left running without the command that waits for it.
  child = _Exits(0, waits=1)
  monkeypatch.setattr(runs_lib.subprocess, "Popen", lambda *a, **k: child)

  def interrupted(*a, **k):
    raise KeyboardInterrupt
  monkeypatch.setattr(runs_lib.storage, "write_json", interrupted)
  with pytest.raises(KeyboardInterrupt):
    runs_lib._run_timed(["launch.study"], str(tmp_path), str(timing))
  assert child.killed


FINDINGS = """# Findings of study_C64

Legend.

| # | the paper's claim | sweep | measured | verdict |
|---|---|---|---|---|
| 1 | n*(C) grows | easy | doublings | **no** |
| 8 | other algorithms | algorithms/cispo | doublings | **indicative** |
| 8 | other algorithms | algorithms_extra | doublings | **indicative** |
| 9 | predicted | all | median | **inconclusive** |

## What the verdicts rest on

Prose.

| # | what is tested | sweep | verdict |
|---|---|---|---|
| K | one ceiling | hard | **no** |

## Seed spread

| sweep | B_p | n |
|---|---|---|
| algorithms/ppo | 16 | 2 |
| easy | 8 | 2 |
"""


def test_the_algorithms_section_reads_its_rows_from_the_study(tmp_path, monkeypatch):
  """The RQ4 sweep runs once, in the study's directory; the algorithms table keeps the
  rows of that sweep's variants only (not a sweep whose name merely starts alike) and
  drops a section left without rows."""
  text = runs_lib.findings_of(FINDINGS, "algorithms")
  rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line
          and not line.startswith(("| # ", "| sweep "))]
  assert rows == ["| 8 | other algorithms | algorithms/cispo | doublings | **indicative** |",
                  "| algorithms/ppo | 16 | 2 |"]
  assert "Legend." in text and "What the verdicts rest on" not in text and "Prose." not in text
  assert "## Seed spread" in text

  from isojax.reproduce import algorithms
  calls = []

  def fake_launch(inv, study_dir, budget, sweeps, flags=()):
    calls.append((study_dir, tuple(sweeps)))
    for part in ("cispo", "ppo"):
      os.makedirs(os.path.join(study_dir, "algorithms", part))
      with open(os.path.join(study_dir, "algorithms", part, "metric_vs_compute.png"), "w") as f:
        f.write(part)
    os.makedirs(os.path.join(study_dir, "easy"))
    open(os.path.join(study_dir, "easy", "metric_vs_compute.png"), "w").close()
    # One run of the sweep (wall_s 100 at its end) and one of another sweep (not counted).
    _write_run(os.path.join(study_dir, "algorithms", "runs", "cispo_bp16_n2"), seed=0,
               counts=[[1, 2], [3, 4]], wall_s=100.0)
    _write_run(os.path.join(study_dir, "easy", "runs", "bp8_n2"), seed=0,
               counts=[[1, 2], [3, 4]], wall_s=7000.0)
    return FINDINGS, 9000.0   # the whole study's wall time: not the sweep's

  monkeypatch.setattr(runs_lib, "launch_study", fake_launch)
  monkeypatch.setattr(runs_lib, "run_presets", lambda *a: (20.0, {}))
  monkeypatch.setattr(demos, "table", lambda runs: "presets")
  monkeypatch.setattr(tables, "environment", lambda repo: dict(
      commit="abc", dirty=False, cpu="c", cpus=2, host_isa="x", isa="x", accelerator="none",
      jax="0", python="3", date="d"))
  inv = tables.Invocation(out=str(tmp_path / "runs"), results=str(tmp_path), repo=ROOT,
                          command="python -m launch.reproduce")
  algorithms.run(inv, ["0"], 64)
  assert calls == [(str(tmp_path / "runs" / "study_C64"), ("configs/sweep_algorithms.py",))]
  table = open(tmp_path / "algorithms.md").read()
  assert f"| {tables.format_seconds(120.0)} |" in table    # presets 20 s + the sweep's 100 s
  assert "algorithms/cispo" in table and "| 1 | n*(C) grows | easy" not in table
  assert sorted(os.listdir(tmp_path / "img")) == [
      "algorithms_algorithms_cispo_metric_vs_compute.png",
      "algorithms_algorithms_ppo_metric_vs_compute.png"]
  assert open(tmp_path / "img" / "algorithms_algorithms_ppo_metric_vs_compute.png").read() == "ppo"
