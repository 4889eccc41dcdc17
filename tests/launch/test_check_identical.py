"""isojax.tools.identical_runs and launch.check_identical: which runs are compared, the base
commit's runs cached by its hash, and a real micro run of this checkout against HEAD."""

import json
import os
import subprocess
import sys

import pytest

from isojax import configs, run_dir
from isojax.tools import identical_runs

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_every_shipped_config_is_run_at_micro_or_skipped_with_a_reason():
  runs, skipped = identical_runs.shipped_runs()
  files = sorted(f for f in os.listdir(configs.PACKAGE_DIR)
                 if f.endswith(".py") and f != "__init__.py")
  micro = [r.config.split(":")[0].removeprefix("configs/") for r in runs
           if r.config.endswith(":micro")]
  assert sorted(micro + [s.name for s in skipped]) == files
  assert all(s.reason for s in skipped)
  assert {"hard.py", "ppo.py", "lora.py", "scalerl.py"} <= set(micro)
  assert {s.name for s in skipped} >= {"smollm2.py", "pilot_smollm2.py", "from_json.py",
                                       "sweep_hard.py"}
  (default,) = [r for r in runs if not r.config.endswith(":micro")]
  assert (default.config, default.flags) == ("configs/hard.py", ("--config.num_steps=20",))
  assert default.argv("/w")[1:] == ["-m", "isojax.main", "--config=configs/hard.py",
                                    "--workdir=/w", "--config.num_steps=20"]


def test_select_names_the_unknown_run():
  runs, _ = identical_runs.shipped_runs()
  assert [r.name for r in identical_runs.select(runs, ["ppo-micro"])] == ["ppo-micro"]
  assert identical_runs.select(runs, []) == runs
  with pytest.raises(ValueError, match=r"--runs: unknown run\(s\) \['hard'\]; expected "
                     r"some of \[.*'hard-micro'"):
    identical_runs.select(runs, ["hard"])


def test_a_base_that_is_not_a_commit_is_named():
  with pytest.raises(ValueError, match="base 'no-such-rev' is not a commit of"):
    identical_runs.resolve_commit(ROOT, "no-such-rev")


def _fake_run(calls):
  """Stands in for `identical_runs.run`: a run directory of config and metrics, whose
  pods-micro loss differs when run from this checkout (not the base's worktree)."""

  def run(spec, tree, workdir, log_path):
    calls.append((spec.name, tree))
    with open(log_path, "w") as f:
      f.write(f"{spec.name} from {tree}\n")
    os.makedirs(workdir)
    run_dir.write_config(workdir, {"name": spec.name})
    loss = 0.5 if spec.name == "pods-micro" and tree == ROOT else 0.25
    with open(run_dir.metrics_path(workdir), "w") as f:
      for step in range(3):
        f.write(json.dumps({"step": step, "rollouts": step, "tokens": step,
                            "wall_s": len(calls), "train/loss": loss * step}) + "\n")
    return 1.5
  return run


def test_base_runs_are_cached_by_commit_and_differences_reported(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(identical_runs, "run", _fake_run(calls))
  names = ["hard-micro", "pods-micro"]
  results = identical_runs.check(ROOT, "HEAD", str(tmp_path), names, log=lambda _: None)
  head = identical_runs.resolve_commit(ROOT, "HEAD")
  ((base_tree, ran),) = {t: [n for n, u in calls if u == t] for _, t in calls
                         if t != ROOT}.items()
  assert ran == names  # in the base commit's worktree
  assert sorted(os.listdir(tmp_path / "base" / head)) == [
      "environment.json", "hard-micro", "hard-micro.log", "pods-micro", "pods-micro.log"]
  hard, pods = results
  assert hard.identical and not pods.identical
  assert identical_runs.report_line(hard) == "hard-micro: identical (base 2 s, new 2 s)"
  assert identical_runs.report_line(pods) == (
      "pods-micro: DIFFERS (base 2 s, new 2 s)\n"
      "  metrics: line 2 (step 1), train/loss: base 0.25, new 0.5")
  git_worktrees = subprocess.run(["git", "-C", ROOT, "worktree", "list"], check=True,
                                 capture_output=True, text=True).stdout
  assert base_tree not in git_worktrees and not os.path.exists(base_tree)  # removed

  calls.clear()  # a second check against the same commit runs the new side only
  again = identical_runs.check(ROOT, head, str(tmp_path), ["hard-micro"], log=lambda _: None)
  assert calls == [("hard-micro", ROOT)]
  assert identical_runs.report_line(again[0]) == "hard-micro: identical (base cached, new 2 s)"

  calls.clear()  # a cache written under other package versions is run again
  env_file = tmp_path / "base" / head / identical_runs.ENVIRONMENT_FILE
  env_file.write_text(json.dumps(dict(identical_runs.environment(), jax="0.0")))
  identical_runs.check(ROOT, head, str(tmp_path), ["hard-micro"], log=lambda _: None)
  assert [name for name, tree in calls if tree != ROOT] == ["hard-micro"]


def test_a_failed_run_is_reported_with_its_log(tmp_path, monkeypatch):
  def failing(spec, tree, workdir, log_path):
    raise RuntimeError(f"{spec.name}: isojax.main exited with status 1 (log: {log_path})")

  monkeypatch.setattr(identical_runs, "run", failing)
  (result,) = identical_runs.check(ROOT, "HEAD", str(tmp_path), ["ppo-micro"],
                                   log=lambda _: None)
  assert not result.identical
  assert identical_runs.report_line(result).startswith(
      "ppo-micro: FAILED: ppo-micro: isojax.main exited with status 1 (log: ")


@pytest.mark.slow("runs configs/hard.py:micro twice (HEAD in a git worktree, then this "
                  "checkout) through launch.check_identical")
def test_this_checkout_computes_what_head_computes(tmp_path):
  """One micro run against HEAD, end to end: identical on a checkout without
  uncommitted changes to the numbers."""
  done = subprocess.run(
      [sys.executable, "-m", "launch.check_identical", "--base=HEAD", "--runs=hard-micro",
       f"--out={tmp_path}"], cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT),
      capture_output=True, text=True, check=False)
  assert done.returncode == 0, done.stdout + done.stderr
  assert "1 of 1 runs identical to HEAD" in done.stdout
  assert "hard-micro: identical (base " in done.stdout
