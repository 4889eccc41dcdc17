"""Sweep kinds and variants: the runs each experiment config plans, and bad configs."""

import ml_collections
import numpy as np
import pytest

from isojax import tasks
from isojax.config import run_settings as settings_lib
from isojax.sweeps import plan as sweep_plan
from isojax.sweeps import sweep_config
from isojax.tasks import Problem


def _plan(spec):
  sweep = sweep_config.load_config_file(spec)
  sweep.overrides.task.split = ""  # generated problems: no profiled split needed
  return {r.name: r for r in sweep_plan.plan_runs(sweep)}


def _alloc(r):
  a = r.allocation
  return (a.problems_per_batch, a.rollouts_per_problem, a.num_steps)


def test_iso_compute_runs_spend_the_budget_with_log_spaced_evaluations():
  runs = _plan("configs/sweep_hard.py")
  assert len(runs) == 12
  for r in runs.values():
    b_p, n, m = _alloc(r)
    assert b_p * n * m == 16384 and b_p in (8, 16) and 2 <= n <= 64 and m >= 16
    assert r.config["eval"]["schedule"] == "log" and r.config["eval"]["count"] == 12


def test_fixed_batch_keeps_b_constant():
  runs = _plan("configs/sweep_fixed_batch.py")
  assert sorted(_alloc(r) for r in runs.values()) == sorted(
      (256 // n, n, 64) for n in (2, 4, 8, 16, 32, 64))


def test_problems_per_batch_fixes_n():
  runs = _plan("configs/sweep_problems_per_batch.py")
  assert sorted(_alloc(r) for r in runs.values()) == [
      (b, 8, 16384 // (8 * b)) for b in (4, 8, 16, 32, 64, 128)]


def test_problem_set_size_variants_limit_the_training_set():
  runs = _plan("configs/sweep_problem_set_size.py")
  sizes = {name.split("/")[0]: r.config["task"]["max_train_problems"]
           for name, r in runs.items()}
  assert sizes == {"p16": 16, "p64": 64, "p256": 256, "all": 0}
  assert len(runs) == 12 and all(_alloc(r)[0] == 16 for r in runs.values())


def test_decoupled_variants():
  runs = _plan("configs/sweep_decoupled.py")
  assert len(runs) == 6
  got = {name: (_alloc(r), r.config["seed"], r.config["rl"]["downsample"],
                r.config["rl"]["train_rollouts_per_problem"], r.config["rl"]["advantages_on"])
         for name, r in runs.items()}
  assert got["plain_train/bp16_n4_s1"] == ((16, 4, 128), 1, "none", 0, "selected")
  assert got["plain_estimate/bp16_n16_s0"] == ((16, 16, 128), 0, "none", 0, "selected")
  assert got["decoupled/bp16_n16_s0"] == ((16, 16, 128), 0, "random", 4, "generated")


def test_algorithm_variants():
  runs = _plan("configs/sweep_algorithms.py")
  assert {n.split("/")[0] for n in runs} == {"cispo", "pods", "ppo"}
  for name, r in runs.items():
    n = _alloc(r)[1]
    if name.startswith("cispo/"):
      assert r.config["rl"]["policy_loss"] == "cispo" and r.config["rl"]["downsample"] == "none"
    elif name.startswith("ppo/"):
      assert r.config["rl"]["advantage"] == "gae" and r.config["rl"]["downsample"] == "none"
      assert r.config["rl"]["policy_loss"] == "ppo_clip"
    else:
      m = r.config["rl"]["train_rollouts_per_problem"]
      assert r.config["rl"]["downsample"] == "max_variance"
      assert m == (max(2, n // 4) if max(2, n // 4) < n else 0)


def test_reasoning_sweep_runs_the_reasoning_gym_family():
  runs = _plan("configs/sweep_reasoning.py")
  assert sorted(_alloc(r) for r in runs.values()) == [
      (16, n, 8192 // (16 * n)) for n in (2, 4, 8, 16, 32)]
  assert all(r.config["task"]["name"] == "reasoning_gym" for r in runs.values())


def _micro():
  return sweep_config.load_config_file("configs/sweep_hard.py:micro")


@pytest.mark.parametrize("field,value,match", [
    ("kind", "isocompute", "kind='isocompute'"),
    ("eval_schedule", "cosine", "eval_schedule"),
    ("train_fraction", 1.5, "train_fraction"),
    ("bootstrap_resamples", 3, "bootstrap_resamples"),
    ("variantz", 1, "unknown field"),
])
def test_bad_sweep_fields_are_named(field, value, match):
  sweep = _micro()
  sweep[field] = value
  with pytest.raises(sweep_config.SweepError, match=match):
    sweep_plan.plan_runs(sweep)


def test_bad_variants_are_named():
  sweep = _micro()
  sweep.variants = ml_collections.ConfigDict({"a": {"kind": "fixed_batch"}})
  with pytest.raises(sweep_config.SweepError, match="variants.a: cannot set field"):
    sweep_plan.plan_runs(sweep)
  sweep = _micro()
  sweep.variants = ml_collections.ConfigDict({"a": {"seeds": (1,)}})
  with pytest.raises(sweep_config.SweepError, match="takes no variants"):
    sweep_plan.plan_runs(sweep)
  sweep = _micro()
  sweep.kind = "decoupled_baseline"
  with pytest.raises(sweep_config.SweepError, match="plain_train"):
    sweep_plan.plan_runs(sweep)
  sweep = _micro()
  sweep.kind = "algorithms"
  sweep.variants = ml_collections.ConfigDict({"a": {"overrides": {"rl": {"polcy_loss": "x"}}},
                                              "b": {}})
  with pytest.raises(sweep_config.SweepError, match="polcy_loss"):
    sweep_plan.plan_runs(sweep)


def test_limit_train_keeps_nested_subsets_and_the_validation_set():
  train = [Problem(prompt=f"{i}+0=", answer=str(i)) for i in range(100)]
  val = [Problem(prompt="1+1=", answer="2")]
  data = tasks.TaskData(train, val, {})
  small = tasks.limit_train(data, 10, seed=7)
  large = tasks.limit_train(data, 40, seed=7)
  assert len(small.train) == 10 and len(large.train) == 40 and small.val == val
  assert set(p.prompt for p in small.train) <= set(p.prompt for p in large.train)
  assert len({p.prompt for p in small.train}) == 10
  assert tasks.limit_train(data, 0, seed=7).train == train
  assert tasks.limit_train(data, 10, seed=8).train != small.train


def test_recall_sweeps_spend_their_budgets_on_their_levels():
  for spec, budget, levels, runs_wanted in (
      ("configs/sweep_recall_hard.py", 65536, (4, 8), 12),
      ("configs/sweep_recall_easy.py", 4096, (1, 2), 9),
      ("configs/sweep_recall_easy.py:long", 16384, (1, 2), 12)):
    sweep = sweep_config.load_config_file(spec)
    runs = {r.name: r for r in sweep_plan.plan_runs(sweep)}
    assert len(runs) == runs_wanted, spec
    keys = 64 * (levels[1] - levels[0] + 1)
    for r in runs.values():
      b_p, n, m = _alloc(r)
      assert b_p * n * m == budget and m >= 16 and b_p in (8, 16), (spec, r.name)
      task = r.config["task"]
      assert (task["name"], task["split"]) == ("recall", "")
      assert (task["recall_min_level"], task["recall_max_level"]) == levels
      assert task["num_train"] == task["num_val"] == keys
      assert tuple(r.config["optim"]["frozen"]) == ("embed",)


def test_the_constant_lr_control_changes_only_the_lr_rule_and_the_name():
  """Each recall sweep's control plans the same runs with lr_scaling='constant': every
  run's peak LR is then the reference LR, where the sqrt rule scales it by
  sqrt(B_p * n / lr_reference_batch)."""
  for spec, preset in (("configs/sweep_recall_hard.py", "constant_lr"),
                       ("configs/sweep_recall_easy.py", "constant_lr"),
                       ("configs/sweep_recall_easy.py:long", "long_constant_lr")):
    plain = sweep_config.load_config_file(spec)
    control = sweep_config.load_config_file(f"{spec.split(':')[0]}:{preset}")
    assert control.name == plain.name + "_constant_lr"
    runs = {r.name: r.config for r in sweep_plan.plan_runs(plain)}
    controls = {r.name: r.config for r in sweep_plan.plan_runs(control)}
    assert runs.keys() == controls.keys()
    for name, config in runs.items():
      other = controls[name]
      assert (config["optim"]["lr_scaling"], other["optim"]["lr_scaling"]) == ("sqrt",
                                                                               "constant")
      same = lambda c: {**c, "optim": {**c["optim"], "lr_scaling": None}}
      assert same(config) == same(other), name
      optim = config["optim"]
      batch = config["problems_per_batch"] * config["rollouts_per_problem"]
      peak = lambda c: settings_lib.RunSettings.from_config(c).learning_rate
      assert peak(other) == pytest.approx(optim["learning_rate"])
      assert peak(config) == pytest.approx(
          optim["learning_rate"] * np.sqrt(batch / optim["lr_reference_batch"]))


def test_a_study_without_a_profile_refuses_a_sweep_on_a_split(tmp_path):
  from isojax.sweeps import study as study_lib  # pylint: disable=g-import-not-at-top
  with pytest.raises(sweep_config.SweepError, match=r"sweep_hard.py: its runs use the "
                     r"profiled split 'hard', but this study profiles nothing"):
    study_lib.prepare_sweep("configs/sweep_hard.py", str(tmp_path), None)
  assert list(tmp_path.iterdir()) == []  # nothing planned or written
