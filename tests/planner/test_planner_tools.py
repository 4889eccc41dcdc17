"""The two absl tools, run as `python -m launch.<tool>` the way users run them."""

import json
import math
import os
import subprocess
import sys

import pytest

from isojax.config import config_lib
from isojax.planner import synthetic

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(tool, *args, cwd=None):
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run([sys.executable, "-m", f"launch.{tool}", *args], cwd=cwd or REPO,
                        env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("runs"))
  curves = synthetic.paper_like_curves([16], [2, 4, 8, 16, 32], n_saturation=16,
                                       c_mid_base=(1 << 19) / 1500)
  synthetic.write_sweep(root, curves, budget_rollouts=1 << 19, num_evals=25, noise=0.003)
  result = _run("analyze", f"--runs={root}")
  assert result.returncode == 0, result.stderr
  return root, result


def test_analyze_writes_json_and_plots(analysed):
  root, result = analysed
  for name in ("analysis.json", "metric_vs_compute.png", "n_star.png", "views.png"):
    assert os.path.getsize(os.path.join(root, name)) > 1000
    assert f"wrote {os.path.join(root, name)}" in result.stdout
  with open(os.path.join(root, "analysis.json")) as f:
    data = json.load(f)
  assert data["n_star_fit"] is not None and len(data["fits"]) == 5


def test_analyze_errors_name_the_problem(analysed, tmp_path):
  root, _ = analysed
  missing = _run("analyze", f"--runs={tmp_path / 'missing'}")
  assert missing.returncode != 0 and "does not exist" in missing.stderr
  unknown = _run("analyze", f"--runs={root}", "--metric=val/avg@8", "--noplots")
  assert unknown.returncode != 0
  assert "metrics that exist: val/avg@4, val/best@4, val/worst@4" in unknown.stderr


def test_help_documents_the_flags():
  for tool, expected in (("analyze", ("--runs", "--metric", "--out_dir")),
                         ("plan", ("--budget_rollouts", "--analysis", "--config", "--grid"))):
    result = _run(tool, "--help")  # absl exits 1 after printing the help
    assert all(flag in result.stdout for flag in expected)
    assert f"python -m launch.{tool}" in result.stdout  # the docstring's example commands


def test_plan_from_analysis(analysed, tmp_path):
  root, _ = analysed
  analysis_path = os.path.join(root, "analysis.json")
  args = ("--budget_rollouts=262144", f"--analysis={analysis_path}", f"--out={tmp_path}")
  first, second = _run("plan", *args), _run("plan", *args)
  assert first.returncode == 0, first.stderr
  assert first.stdout == second.stdout  # deterministic
  plan = json.loads(first.stdout)
  with open(analysis_path) as f:
    law = json.load(f)["n_star_fit"]
  # The law by hand at C, rounded to a power of two in log2.
  log2_n = law["log2_n_low"] + (law["log2_n_high"] - law["log2_n_low"]) / (
      1 + (law["c_mid"] / 262144) ** law["b"])
  assert plan["rollouts_per_problem"] == 2 ** math.floor(log2_n + 0.5)
  assert plan["problems_per_batch"] == config_lib.base_config().problems_per_batch
  batch = plan["rollouts_per_problem"] * plan["problems_per_batch"]
  assert plan["num_steps"] == 262144 // batch
  assert plan["effective_learning_rate"] == pytest.approx(1e-4 * math.sqrt(batch / 128))
  with open(plan["config_path"]) as f:
    config = json.load(f)
  assert config["rollouts_per_problem"] == plan["rollouts_per_problem"]
  assert config["num_steps"] == plan["num_steps"] and config["optim"]["learning_rate"] == 1e-4


def test_plan_default_law_with_config_file_and_grid(tmp_path):
  config_file = tmp_path / "easy_cfg.py"
  config_file.write_text(
      "from isojax.config import config_lib\n"
      "def get_config(arg=None):\n"
      "  return config_lib.apply_recipe(config_lib.base_config(), 'easy')\n")
  single = _run("plan", "--budget_rollouts=65536", f"--config={config_file}",
                f"--out={tmp_path}")
  assert single.returncode == 0, single.stderr
  plan = json.loads(single.stdout)
  assert plan["law"]["source"] == "paper default (easy)"
  assert plan["law"]["n_saturation"] == 512
  grid = _run("plan", "--budget_rollouts=65536", f"--config={config_file}", "--grid",
              "--max_batch_rollouts=1024", f"--out={tmp_path}")
  assert grid.returncode == 0, grid.stderr
  manifest = json.loads(grid.stdout)
  # Brute force: powers of two B_p in [8, 1024], n in [2, 2048], B <= 1024, M >= 10.
  expected = {(b_p, n) for b_p in (2 ** i for i in range(3, 11))
              for n in (2 ** i for i in range(1, 12))
              if b_p * n <= 1024 and 65536 // (b_p * n) >= 10}
  got = {(a["problems_per_batch"], a["rollouts_per_problem"]) for a in manifest["allocations"]}
  assert got == expected
  for entry in manifest["allocations"]:
    with open(entry["config_path"]) as f:
      config = json.load(f)
    assert config["problems_per_batch"] * config["rollouts_per_problem"] * config[
        "num_steps"] == 65536
    assert config["rl"]["kl_coef"] > 0  # the base config's recipe is kept


def test_plan_writes_nothing_without_out(analysed, tmp_path):
  """Without --out the prescription and the grid are printed only: no file anywhere."""
  root, _ = analysed
  before = sorted(os.listdir(root))
  work = tmp_path / "cwd"
  work.mkdir()
  config = os.path.join(REPO, "isojax", "configs", "hard.py")
  single = _run("plan", "--budget_rollouts=262144", f"--analysis={root}/analysis.json",
                f"--config={config}", cwd=str(work))
  grid = _run("plan", "--budget_rollouts=65536", f"--config={config}", "--grid",
              cwd=str(work))
  assert single.returncode == 0 and grid.returncode == 0, single.stderr + grid.stderr
  assert "config_path" not in json.loads(single.stdout)
  assert all("config_path" not in a for a in json.loads(grid.stdout)["allocations"])
  assert os.listdir(work) == [] and sorted(os.listdir(root)) == before


def test_plan_budget_too_small():
  result = _run("plan", "--budget_rollouts=100")
  assert result.returncode != 0
  assert "too small for any allocation" in result.stderr


def test_planned_config_round_trips_through_from_json(tmp_path):
  """What the main loop sees: configs/hard.py planned, written, reloaded, resolved."""
  result = _run("plan", "--budget_rollouts=131072", "--config=configs/hard.py",
                f"--out={tmp_path}")
  assert result.returncode == 0, result.stderr
  plan = json.loads(result.stdout)
  assert plan["law"]["source"] == "paper default (hard)"  # the hard recipe has no KL
  config = config_lib.resolve(config_lib.config_from_json(plan["config_path"]))
  assert config.rollouts_per_problem == plan["rollouts_per_problem"]
  assert config.problems_per_batch == plan["problems_per_batch"]
  assert config.num_steps == plan["num_steps"]
  assert config.budget_rollouts == plan["budget_rollouts"] <= 131072
  assert config_lib.settings(config).learning_rate == pytest.approx(plan["effective_learning_rate"])


_RUN_CONFIGS = sorted(f"configs/{name}" for name in os.listdir(os.path.join(REPO, "configs"))
                      if name.endswith(".py") and not name.startswith(("sweep_", "_"))
                      and name != "from_json.py")


def test_every_shipped_run_config_is_planned_with_the_runs_own_figures():
  """For each shipped run config, what launch.plan reports (the same functions it calls)
  against what the run derives: the peak of the LR schedule the training loop logs as
  train/learning_rate (`optimizer.make_optimizer`, evaluated at every step of the run) and
  the step count of the written config, resolved as isojax.main resolves it."""
  from isojax.config import run_settings
  from isojax.planner import prescribe
  from isojax.rl import optimizer
  from isojax.sweeps import sweep_config
  assert "configs/pods.py" in _RUN_CONFIGS and len(_RUN_CONFIGS) >= 10
  for spec in _RUN_CONFIGS:
    base = sweep_config.load_config_file(spec)
    budget = 1 << 18
    law = prescribe.default_law(prescribe.difficulty_of(base), 1024)
    plan = prescribe.prescribe(budget, law, base, max_batch_rollouts=1024,
                               problems_range=(8, 1024), rollouts_range=(2, 2048),
                               min_steps=10).to_dict()
    a = plan["rollouts_per_problem"], plan["problems_per_batch"], plan["num_steps"]
    config = config_lib.resolve_dict(prescribe.to_config(
        prescribe.grids.Allocation(problems_per_batch=a[1], rollouts_per_problem=a[0],
                                   num_steps=a[2]), base))
    s = run_settings.RunSettings.from_config(config)
    _, schedule = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                        warmup_steps=s.warmup_steps,
                                        updates_per_step=s.rl.updates_per_step)
    logged = [float(schedule(step * s.rl.updates_per_step)) for step in range(s.num_steps)]
    assert plan["effective_learning_rate"] == pytest.approx(max(logged), rel=1e-6), spec
    assert plan["num_steps"] == s.num_steps, spec
    m = s.rl.train_rollouts(s.rollouts_per_problem)
    assert plan["trained_batch_rollouts"] == s.problems_per_batch * m, spec
    assert plan["rollouts_per_step"] == s.problems_per_batch * s.rollouts_per_problem, spec


@pytest.mark.slow("a 12-step PODS run of the micro model")
def test_plan_for_pods_prints_the_lr_its_run_logs(tmp_path):
  """configs/pods.py trains on m = 2 of n = 4 rollouts (micro): launch.plan's LR is the
  run's logged train/learning_rate at its peak (it scaled with B_p * n before)."""
  result = _run("plan", "--budget_rollouts=192", "--config=configs/pods.py:micro",
                f"--out={tmp_path}", "--min_problems_per_batch=4",
                "--max_problems_per_batch=4", "--min_rollouts_per_problem=4",
                "--max_rollouts_per_problem=4")
  assert result.returncode == 0, result.stderr
  plan = json.loads(result.stdout)
  assert (plan["problems_per_batch"], plan["rollouts_per_problem"], plan["num_steps"]) == (
      4, 4, 12)
  assert (plan["train_rollouts_per_problem"], plan["trained_batch_rollouts"]) == (2, 8)
  work = tmp_path / "run"
  run = subprocess.run([sys.executable, "-m", "isojax.main",
                        f"--config=configs/from_json.py:{plan['config_path']}",
                        f"--workdir={work}", "--config.eval.count=1"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  lines = [json.loads(l) for l in open(work / "metrics.jsonl")]
  lrs = [l["train/learning_rate"] for l in lines if "train/learning_rate" in l]
  assert len(lrs) == 12 == plan["num_steps"]
  assert max(lrs) == pytest.approx(plan["effective_learning_rate"], rel=1e-6)
  # The reference LR scaled by sqrt(B_p * m / B_ref), by hand.
  base = json.load(open(plan["config_path"]))["optim"]
  assert max(lrs) == pytest.approx(base["learning_rate"] * math.sqrt(
      8 / base["lr_reference_batch"]), rel=1e-6)
