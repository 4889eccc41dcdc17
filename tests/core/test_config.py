"""Config validation errors name the field, before anything is compiled."""

import json
import math
import os

import pytest

from isojax import eval_settings
from isojax.config import config_lib


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
  assert config_lib.settings(config_lib.resolve(c)).learning_rate == pytest.approx(expected)


@pytest.mark.parametrize("n,b_p,steps", [(2, 8, 63), (16, 16, 4), (64, 16, 1)])
def test_warmup_in_rollouts_gives_every_allocation_the_same_compute(n, b_p, steps):
  """1,000 warm-up rollouts at B_p * n a step: ceil(1000 / (B_p * n)) steps, the fewest
  whose rollouts reach 1,000; the optimizer's schedule peaks at that step."""
  from isojax.rl import optimizer  # pylint: disable=g-import-not-at-top
  c = _config(rollouts_per_problem=n, problems_per_batch=b_p)
  c.optim.update(warmup_steps=0, warmup_rollouts=1000)
  s = config_lib.settings(config_lib.resolve(c))
  assert s.warmup_steps == steps
  assert (steps - 1) * b_p * n < 1000 <= steps * b_p * n
  _, schedule = optimizer.make_optimizer(s.optim, peak_learning_rate=1.0,
                                         warmup_steps=s.warmup_steps, updates_per_step=1)
  assert float(schedule(steps - 1)) < 1.0 == float(schedule(steps))


def test_warmup_in_steps_and_in_rollouts_together_is_refused():
  c = _config()
  c.optim.update(warmup_steps=10, warmup_rollouts=1000)
  with pytest.raises(ValueError, match=r"optim.warmup_steps=10 and optim.warmup_rollouts="
                                       r"1000: set one"):
    config_lib.resolve(c)
  c.optim.update(warmup_steps=0, warmup_rollouts=-1)
  with pytest.raises(ValueError, match="optim.warmup_rollouts=-1"):
    config_lib.resolve(c)


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


@pytest.mark.parametrize("field", ["weights_dtype", "dtype"])
def test_bad_sampling_dtypes_name_their_field(field):
  c = _config()
  c.sampling[field] = "float16"
  with pytest.raises(ValueError, match=rf"sampling.{field}='float16': expected '', float32"):
    config_lib.resolve(c)
  c.sampling[field] = "bfloat16"
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


def _schedule(num_steps, **fields):
  """The evaluation steps of the default `eval` fields with `fields` changed."""
  e = config_lib.base_config().eval
  e.update(fields)
  return eval_settings.EvalSettings.from_config(e).steps(num_steps)


@pytest.mark.parametrize("num_steps,every,expected", [
    (10, 4, {0, 4, 8, 10}), (8, 4, {0, 4, 8}), (10, 20, {0, 10}), (3, 1, {0, 1, 2, 3})])
def test_linear_eval_steps_are_multiples_of_every_and_the_last(num_steps, every, expected):
  steps = _schedule(num_steps, schedule="linear", every=every)
  assert steps == expected
  # The rule train.run used before schedules existed, by brute force.
  assert steps == {s for s in range(num_steps + 1) if s % every == 0 or s == num_steps}


@pytest.mark.parametrize("num_steps,count,expected", [
    # 100^(i/4) = 1, 3.16, 10, 31.6, 100
    (100, 5, {0, 1, 3, 10, 32, 100}),
    # 10^(i/15) = 1, 1.17, 1.36, 1.58, 1.85, 2.15, 2.51, 2.93, 3.41, 3.98, 4.64, 5.41,
    # 6.31, 7.36, 8.58, 10: 9 distinct steps of 16, step 8 skipped
    (10, 16, {0, 1, 2, 3, 4, 5, 6, 7, 9, 10}),
    (1, 16, {0, 1}),
    (50, 1, {0, 50}),   # one evaluation: the final policy
    (50, 2, {0, 1, 50}),
])
def test_log_eval_steps_are_rounded_geometric_and_keep_the_last(num_steps, count, expected):
  # `every` must not matter to the log schedule.
  for every in (1, 7):
    steps = _schedule(num_steps, schedule="log", every=every, count=count)
    assert steps == expected


def test_log_eval_steps_match_a_closed_form():
  num_steps, count = 200, 16
  ratio = num_steps ** (1 / (count - 1))
  expected = {0} | {int(math.floor(ratio**i + 0.5)) for i in range(count)}
  assert _schedule(num_steps, schedule="log", count=count) == expected


@pytest.mark.parametrize("fields,message", [
    (dict(schedule="cosine"), r"eval\.schedule='cosine': expected one of \['linear', 'log'\]"),
    (dict(schedule="log", count=0), r"eval\.count=0: expected a positive integer"),
    (dict(schedule="log", count=-3), r"eval\.count=-3: expected a positive integer"),
    (dict(schedule="linear", every=0), r"eval\.every=0: expected a positive integer"),
])
def test_bad_eval_schedule_names_the_field(fields, message):
  c = _config()
  c.eval.update(fields)
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(c)
  with pytest.raises(ValueError, match=message):
    eval_settings.EvalSettings.from_config(c.eval)


def test_eval_schedule_defaults_resolve():
  c = config_lib.resolve(_config())
  assert (c.eval.schedule, c.eval.count) == ("linear", 16)
  c = _config()
  c.eval.update(schedule="log", count=4)
  resolved = config_lib.resolve(c)
  assert eval_settings.EvalSettings.from_config(resolved.eval).steps(10) == {0, 1, 2, 5, 10}


@pytest.mark.parametrize("fields,message", [
    (dict(allocation_n_min=9, allocation_n_max=8),
     r"rl.allocation_n_min=9 is above rl.allocation_n_max=8"),
    (dict(allocation_n_min=5), r"rollouts_per_problem=4 with rl.allocation='per_problem': the "
     r"step's budget of B_p \* n rollouts must give every problem between "
     r"rl.allocation_n_min=5"),
    (dict(allocation_n_max=3), r"between rl.allocation_n_min=2 and rl.allocation_n_max=3"),
    (dict(allocation_prior_mean=1.0), r"rl.allocation_prior_mean=1.0: expected a pass-rate "
     r"prior in \(0, 1\)"),
    (dict(allocation_prior_mean=0.0), r"rl.allocation_prior_mean=0.0"),
    (dict(allocation_prior_strength=0.0), r"rl.allocation_prior_strength=0.0"),
    (dict(allocation_n_min=1), r"rl.allocation_n_min=1 with rl.advantage='grpo'"),
    (dict(max_staleness=1, off_policy="pipeline_in_flight"),
     r"with rl.off_policy='pipeline_in_flight': not supported"),
])
def test_bad_per_problem_allocation_names_the_field(fields, message):
  c = _config(rollouts_per_problem=4)
  c.rl.update(allocation="per_problem", **fields)
  with pytest.raises(ValueError, match=message):
    config_lib.settings(config_lib.resolve(c))


def test_per_problem_bounds_default_to_two_and_four_n():
  c = _config(rollouts_per_problem=4)
  c.rl.allocation = "per_problem"
  rl = config_lib.settings(config_lib.resolve(c)).rl
  assert rl.per_problem and rl.group_bounds(4) == (2, 16)
