"""Config validation errors name the field, before anything is compiled."""

import json
import os

import pytest

from isojax import config_lib


def _config(**top):
  c = config_lib.base_config()
  c.num_steps = 10
  for k, v in top.items():
    c[k] = v
  return c


def test_derives_num_steps_from_budget():
  c = config_lib.base_config()
  c.rollouts_per_problem, c.problems_per_batch, c.budget_rollouts = 4, 8, 320
  assert config_lib.resolve(c).num_steps == 10


def test_fills_budget_from_allocation():
  assert config_lib.resolve(_config(rollouts_per_problem=4, problems_per_batch=8)
                            ).budget_rollouts == 4 * 8 * 10


@pytest.mark.parametrize("field,value", [
    ("rollouts_per_problem", 0), ("problems_per_batch", -2), ("num_steps", 0),
    ("budget_rollouts", -5)])
def test_non_positive_allocation_names_field(field, value):
  with pytest.raises(ValueError, match=field):
    config_lib.resolve(_config(**{field: value}))


def test_budget_disagreement():
  with pytest.raises(ValueError, match="budget_rollouts=100 disagrees"):
    config_lib.resolve(_config(budget_rollouts=100))


def test_budget_not_divisible():
  c = config_lib.base_config()
  c.rollouts_per_problem, c.problems_per_batch, c.budget_rollouts = 4, 8, 100
  with pytest.raises(ValueError, match="not a multiple"):
    config_lib.resolve(c)


def test_single_rollout_with_group_advantage():
  with pytest.raises(ValueError, match="rollouts_per_problem=1.*grpo"):
    config_lib.resolve(_config(rollouts_per_problem=1))


def test_unknown_field_from_json(tmp_path):
  path = tmp_path / "plan.json"
  path.write_text(json.dumps({"rollouts_per_problem": 8, "rl": {"klcoef": 0.1}}))
  with pytest.raises(ValueError, match=r"plan.json.*rl\.klcoef"):
    config_lib.config_from_json(str(path))


def test_from_json_overrides_fields(tmp_path):
  path = tmp_path / "plan.json"
  path.write_text(json.dumps({"rollouts_per_problem": 32, "num_steps": 7,
                              "optim": {"learning_rate": 0.5}}))
  c = config_lib.resolve(config_lib.config_from_json(str(path)))
  assert (c.rollouts_per_problem, c.num_steps, c.optim.learning_rate) == (32, 7, 0.5)
  assert c.optim.lr_scaling == config_lib.base_config().optim.lr_scaling


def test_entropy_needs_kl():
  c = _config()
  c.rl.entropy_coef, c.rl.kl_coef = 0.01, 0.0
  with pytest.raises(ValueError, match="entropy_coef"):
    config_lib.resolve(c)


@pytest.mark.parametrize("rule,expected", [("constant", 1e-3), ("sqrt", 2e-3), ("linear", 4e-3)])
def test_learning_rate_scaling(rule, expected):
  c = _config(rollouts_per_problem=16, problems_per_batch=32)  # B = 512 = 4 * B_ref
  c.optim.update(learning_rate=1e-3, lr_reference_batch=128, lr_scaling=rule)
  assert config_lib.learning_rate(config_lib.resolve(c)) == pytest.approx(expected)


def test_recipe_table_rows():
  easy = config_lib.apply_recipe(config_lib.base_config(), "easy")
  hard = config_lib.apply_recipe(config_lib.base_config(), "hard")
  assert easy.rl.kl_coef > 0 and easy.rl.entropy_coef > 0
  assert hard.rl.kl_coef == 0 and hard.rl.entropy_coef == 0


@pytest.mark.parametrize("field,value,message", [
    ("remat", "dots", r"model.remat='dots'.*dots_saveable"),
    ("dtype", "float16", r"model.dtype='float16'")])
def test_bad_model_fields_name_field(field, value, message):
  c = _config()
  c.model[field] = value
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(c)


def test_unknown_field_names_itself_and_the_closest_known_field():
  c = _config()
  c.rl.unlock()
  c.rl.klcoef = 0.1
  with pytest.raises(ValueError, match=r"unknown config field\(s\): rl\.klcoef \(did you "
                                       r"mean rl\.kl_coef\?\)"):
    config_lib.resolve(c)
  with pytest.raises(ValueError, match=r"--config\.sampling\.temprature: unknown config "
                                       r"field sampling\.temprature \(did you mean "
                                       r"sampling\.temperature\?\)"):
    config_lib.check_overrides(["main", "--workdir=/x", "--config.sampling.temprature=1"])
  with pytest.raises(ValueError, match=r"--config\.zzz: unknown config field zzz$"):
    config_lib.check_overrides(["main", "--config.zzz=1"])
  # known fields, free-form dicts and other flags pass
  config_lib.check_overrides(["main", "--config.rl.kl_coef=0.1", "--config=configs/hard.py",
                              "--config.task.dataset_kwargs.min_terms=2", "--workdir=/x"])


def test_main_rejects_an_unknown_override_before_running(tmp_path):
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  proc = subprocess.run(
      [sys.executable, "-m", "isojax.main", "--config=configs/hard.py:micro",
       f"--workdir={tmp_path}/run", "--config.problems_per_bach=4"],
      capture_output=True, text=True, timeout=120,
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert proc.returncode != 0
  assert "did you mean problems_per_batch?" in proc.stderr
  assert not (tmp_path / "run").exists()
