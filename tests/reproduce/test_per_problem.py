"""The per_problem and per_problem_smollm2 sections: the profile, both arms' commands, the
full-size sweep, the tables.

No model runs: the profile, the runs and the study are recorded stand-ins that write
what `launch.profile`, `isojax.main` and `launch.study` would, and the tables are
computed from them."""

import json
import math
import os

import pytest

from isojax import run_dir
from isojax.config import config_lib
from isojax.reproduce import per_problem, per_problem_smollm2, smollm2_study, tables
from isojax.reproduce import runs as runs_lib


def _invocation(tmp_path):
  return tables.Invocation(out=str(tmp_path / "out"), results=str(tmp_path / "results"),
                           repo=str(tmp_path), command="python -m launch.reproduce")


def _lines(reach_step: int, peak: float):
  """A run evaluated every 8 steps of 64 rollouts, rising linearly to `peak` at
  `reach_step` and flat after; half its groups without a signal."""
  out = []
  for step in range(0, 33, 8):
    value = peak * min(step, reach_step) / reach_step
    out.append({run_dir.STEP: step, run_dir.ROLLOUTS: 64 * step, run_dir.TOKENS: 640 * step,
                run_dir.WALL_S: 10.0 * step, "val/avg@4": value,
                "train/zero_variance_fraction": 0.5})
  return out


FINDINGS = """# Findings

| claim | statement | sweep | statistic | effect | verdict |
|---|---|---|---|---|---|
| 1 | n* grows | hard | doublings | +1.0 | **yes** |
| 10 | per-problem allocation reaches the uniform frontier's best value with less compute | per_problem | log2 ratio | -0.50 [-0.90, -0.10] | **yes** |
"""


@pytest.fixture
def recorded(tmp_path, monkeypatch):
  monkeypatch.setattr(tables, "environment", lambda repo: dict(
      commit="abc", dirty=False, cpu="c", cpus=2, host_isa="x", isa="x", accelerator="none",
      jax="0", python="3", date="d"))
  calls = {"profile": [], "runs": [], "study": []}

  def profile(cmd, **kwargs):
    calls["profile"].append((cmd, kwargs["cwd"]))

  def run_main(inv, config, workdir, seed, extra=(), env=None):
    calls["runs"].append((config, os.path.basename(workdir), seed, tuple(extra)))
    os.makedirs(workdir, exist_ok=True)
    # The per-problem arm reaches the uniform arm's peak at step 16, uniform at 24.
    lines = _lines(16 if "candidate" in workdir else 24, 0.3)
    with open(os.path.join(workdir, run_dir.METRICS_FILE), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in lines)
    return 100.0

  def launch_study(inv, study_dir, budget, sweeps=(), study_flags=()):
    calls["study"].append((study_dir, budget, tuple(sweeps), tuple(study_flags)))
    png = os.path.join(study_dir, "per_problem", "uniform", "metric_vs_compute.png")
    os.makedirs(os.path.dirname(png), exist_ok=True)
    open(png, "wb").close()
    # The sweep's runs: two steps each; no signal in 0.1 * seed of the groups (0.2 more
    # under per-problem allocation), rewards n / 100 and n / 100 + 0.1 * seed (0.01 less).
    for n in (4, 8):
      for mode in ("uniform", "per_problem"):
        for seed in (0, 1):
          workdir = os.path.join(study_dir, "per_problem", "runs", mode, f"bp16_n{n}_s{seed}")
          run_dir.write_config(workdir, dict(rollouts_per_problem=n,
                                             rl=dict(allocation=mode)))
          less = 0.01 if mode == "per_problem" else 0.0
          with open(os.path.join(workdir, run_dir.METRICS_FILE), "w") as f:
            for step, reward in ((1, n / 100), (2, n / 100 + 0.1 * seed)):
              f.write(json.dumps({run_dir.STEP: step, run_dir.ROLLOUTS: 64 * step,
                                  run_dir.TOKENS: 640 * step, run_dir.WALL_S: 1.0 * step,
                                  "train/reward": reward - less,
                                  "train/zero_variance_fraction":
                                      0.1 * seed + (0.2 if less else 0.0)}) + "\n")
    return FINDINGS, 50.0

  monkeypatch.setattr(per_problem_smollm2.subprocess, "run", profile)
  monkeypatch.setattr(runs_lib, "launch_study", launch_study)
  monkeypatch.setattr(runs_lib, "run_main", run_main)
  monkeypatch.setattr(smollm2_study, "recipe_mismatches", lambda config: [])
  return calls


def test_the_section_profiles_once_then_runs_both_arms_on_the_mixed_split(tmp_path,
                                                                          recorded):
  inv = _invocation(tmp_path)
  path = per_problem_smollm2.run(inv, ["0", "1", "2"])
  splits_dir = os.path.join(inv.out, "smollm2_study", "splits")
  [(cmd, cwd)] = recorded["profile"]
  assert cwd == inv.repo and cmd[1:3] == ["-m", "launch.profile"]
  assert "--config=configs/smollm2.py:profile" in cmd and f"--out={splits_dir}" in cmd
  assert "--splits=easy,hard,mix_hard_easy" in cmd  # the study's own profile, one for both
  shared = ("--config.task.split=mix_hard_easy", f"--config.task.splits_dir={splits_dir}",
            "--config.num_steps=32", "--config.eval.every=8")
  assert recorded["runs"] == [
      run for seed in ("0", "1", "2") for run in (
          ("configs/smollm2.py", f"baseline_s{seed}", seed, shared),
          ("configs/smollm2.py", f"candidate_s{seed}", seed,
           (*shared, "--config.rl.allocation=per_problem")))]
  text = open(path).read()
  # 16 of 24 steps' rollouts on every seed: the ratio 2/3, the same on every resample.
  assert "| smollm2 | per-problem allocation reaches the uniform peak with less compute | " \
         "0.67x [0.67, 0.67] | **yes** | 0.50, 0.50, 0.50 | 0.50, 0.50, 0.50 |" in text
  assert per_problem.LEVEL == pytest.approx(0.96667, abs=1e-5)  # 1 - 0.10 / 3 testbeds
  assert "96.7%" in text
  # The testbed's curves, both arms of each seed, plotted beside its table.
  assert "(img/per_problem_smollm2.png)" in text
  assert os.path.getsize(os.path.join(inv.results, "img", "per_problem_smollm2.png")) > 1000


def test_the_verdict_rows_interval_is_drawn_at_the_level_it_is_given():
  """Two seeds at ratios 1/2 and 2: log ratios +-ln 2, mean 0, SD sqrt(2) ln 2. Student's
  t with one degree of freedom is Cauchy, whose q-quantile is tan(pi (q - 1/2)), so the
  interval is exp(+-tan(pi level / 2) ln 2) = 2^(+-tan(pi level / 2))."""
  rows = [dict(seed=seed, baseline={run_dir.ROLLOUTS: 100.0},
               candidate={run_dir.ROLLOUTS: rollouts},
               signal={"baseline": 0.5, "candidate": 0.5})
          for seed, rollouts in (("0", 50.0), ("1", 200.0))]
  for level in (per_problem.LEVEL, 0.4):
    half = math.tan(math.pi * level / 2)
    assert (f"1.00x [{2 ** -half:.2f}, {2 ** half:.2f}] | **inconclusive**"
            in per_problem.verdict_row("x", rows, level))


def test_the_testbeds_flags_make_a_valid_per_problem_run_at_the_studys_budget():
  bed = per_problem_smollm2.testbed("/splits")
  argv = [*bed.flags, *bed.candidate_flags]
  config_lib.check_overrides(["main", *argv])  # every flag names a field
  config = per_problem_smollm2.smollm2.get_config()
  for arg in argv:
    name, value = arg[len("--config."):].split("=", 1)
    *sections, field = name.split(".")
    parent = config
    for section in sections:
      parent = parent[section]
    parent[field] = int(value) if value.isdigit() else value
  s = config_lib.settings(config_lib.resolve(config))
  assert (s.task.split, s.task.splits_dir, s.rl.allocation) == (
      "mix_hard_easy", "/splits", "per_problem")
  # 8 x 8 for 32 steps: the seeded study's budget; 2 to 4 n rollouts for one problem.
  assert s.budget_rollouts == 8 * 8 * 32 == smollm2_study.BUDGET
  assert s.rl.group_bounds(8) == (2, 32)


def test_the_section_refuses_before_anything_while_the_recipe_is_not_the_pilots(
    tmp_path, recorded, monkeypatch):
  monkeypatch.setattr(smollm2_study, "recipe_mismatches",
                      lambda config: ["rl.overlong='reward' (the pilot's: 'zero')"])
  with pytest.raises(ValueError, match=r"rl.overlong='reward' \(the pilot's: 'zero'\)"):
    per_problem_smollm2.run(_invocation(tmp_path), ["0"])
  assert recorded == {"profile": [], "runs": [], "study": []}


def test_the_per_problem_section_runs_its_testbeds_then_the_full_sweep(tmp_path, recorded):
  inv = _invocation(tmp_path)
  path = per_problem.run(inv, ["0", "1", "2", "3", "4"])
  # Two testbeds x five seeds x two arms, each testbed's own flags only.
  assert len(recorded["runs"]) == 20
  assert ("configs/recall.py", "candidate_s4", "4", ("--config.rl.allocation=per_problem",)) \
      in recorded["runs"]
  [(study_dir, budget, sweeps, flags)] = recorded["study"]
  assert (study_dir, budget, sweeps, flags) == (
      os.path.join(inv.out, "per_problem", "sweep"), 16384,
      ("configs/sweep_per_problem.py",), ("--seeds=0,1,2,3,4",))
  text = open(path).read()
  assert "| 10 | per-problem allocation reaches the uniform frontier's best value" in text
  assert "| 1 | n* grows | hard |" not in text  # only the per_problem sweep's rows
  assert "| arithmetic | per-problem allocation reaches the uniform peak" in text
  # Signal: 1 - mean(0, 0.1) = 0.95 (per-problem 0.2 less); reward: n / 100 + 0.025.
  assert "| 4 | 0.950 | 0.750 | 0.065 | 0.055 |\n| 8 | 0.950 | 0.750 | 0.105 | 0.095 |" in text
  image = "per_problem_per_problem_uniform_metric_vs_compute.png"
  assert f"(img/{image})" in text and os.path.isfile(os.path.join(inv.results, "img", image))
