"""Resume settings: which fields count, what the history makes of them, what is refused."""

import json

import pytest

from isojax import run_dir
from isojax.config import config_lib
from isojax.run import resume_check


def _config(**fields):
  config = config_lib.base_config()
  config.update(dict(num_steps=4, budget_rollouts=None))
  for name, value in fields.items():
    section, _, leaf = name.rpartition(".")
    (config[section] if section else config)[leaf] = value
  return config_lib.resolve(config)


def _workdir(tmp_path, history=()):
  saved = _config(**{"rl.micro_batch_size": 8}).to_dict()  # as the memory plan set it
  run_dir.write_config(str(tmp_path), saved)
  for line in history:
    run_dir.append_config_history(str(tmp_path), line)
  return str(tmp_path)


def test_settings_are_every_field_but_the_named_exceptions(tmp_path):
  workdir = _workdir(tmp_path)
  same = resume_check.dotted_fields(_config())
  # A planned pass left at 0, the viewers, the cadence, the guard, the device layout.
  moved = resume_check.dotted_fields(_config(**{
      "metric_writers.tensorboard": False, "checkpoint_every": 7, "checkpoint_keep": 3,
      "log_every": 2, "guard.stop_on_collapse": True, "mesh.data": 1, "mesh.fsdp": -1,
      "task.verifier_workers": 2}))
  recorded = resume_check.recorded(workdir, step=4)
  assert resume_check.changes(recorded, same) == {}
  assert resume_check.changes(recorded, moved) == {}
  # A pass set by hand is a setting; so is everything else.
  hand = resume_check.dotted_fields(_config(**{"rl.micro_batch_size": 4,
                                             "sampling.temperature": 1.0,
                                             "sampling.stop_token_ids": (7,)}))
  assert resume_check.changes(recorded, hand) == {
      "rl.micro_batch_size": {"old": 8, "new": 4},
      "sampling.temperature": {"old": 0.6, "new": 1.0},
      "sampling.stop_token_ids": {"old": [], "new": [7]}}
  # A field config.json lacks (the run predates it) is not compared.
  assert resume_check.changes({}, hand) == {}


def test_a_changed_setting_is_refused_naming_each_field_and_both_values(tmp_path):
  workdir = _workdir(tmp_path)
  before = open(run_dir.config_path(workdir)).read()
  requested = resume_check.dotted_fields(_config(**{"optim.learning_rate": 1e-3,
                                                  "model.lora.rank": 4}))
  with pytest.raises(resume_check.SettingsChanged) as refused:
    resume_check.check(workdir, requested, step=2)
  message = str(refused.value)
  assert "optim.learning_rate 0.0001 -> 0.001" in message
  assert "model.lora.rank 0 -> 4" in message
  assert "--allow_changed=model.lora.rank,optim.learning_rate" in message
  # Allowing one of them is not enough; a section allows its fields.
  with pytest.raises(resume_check.SettingsChanged, match="model.lora.rank 0 -> 4"):
    resume_check.check(workdir, requested, step=2, allow=["optim.learning_rate"])
  assert resume_check.check(workdir, requested, step=2,
                               allow=["optim", "model.lora.rank"]) == {
      "optim.learning_rate": {"old": 1e-4, "new": 1e-3},
      "model.lora.rank": {"old": 0, "new": 4}}
  assert open(run_dir.config_path(workdir)).read() == before  # the check only reads
  assert not run_dir.config_history_path(workdir).exists()


def test_the_allocation_cannot_be_allowed_and_unknown_fields_are_named(tmp_path):
  workdir = _workdir(tmp_path)
  requested = resume_check.dotted_fields(_config(seed=3))
  with pytest.raises(resume_check.SettingsChanged, match="different seed=0 .*asked for "
                     "seed=3.*new --workdir"):
    resume_check.check(workdir, requested, step=2, allow=["optim.learning_rate"])
  with pytest.raises(ValueError, match="seed.*cannot change on resume"):
    resume_check.check(workdir, requested, step=2, allow=["seed"])
  with pytest.raises(ValueError, match="optim.learning_rat .did you mean "
                     "optim.learning_rate"):
    resume_check.check(workdir, requested, step=2, allow=["optim.learning_rat"])


def test_the_history_applies_from_its_step_and_a_later_line_ends_a_discarded_branch(
    tmp_path):
  lr = "optim.learning_rate"
  workdir = _workdir(tmp_path)
  event = resume_check.record(workdir, 6, {lr: {"old": 1e-4, "new": 1e-3}})
  assert event["event"] == "settings_changed" and "0.0001 -> 0.001" in event["message"]
  assert [resume_check.recorded(workdir, s)[lr] for s in (4, 6, 8)] == [1e-4, 1e-3, 1e-3]
  # The run went back to step 2 (checkpoints 4 and 6 set aside): the change at 6 belonged
  # to the discarded part, so later resumes see the first value again.
  assert resume_check.needs_record(workdir, 2, {}, superseded=[4, 6])
  assert resume_check.record(workdir, 2, {}, superseded=[6, 4]) is None
  assert [resume_check.recorded(workdir, s)[lr] for s in (2, 6, 8)] == [1e-4] * 3
  assert not resume_check.needs_record(workdir, 8, {}, superseded=[])
  lines = [json.loads(line) for line in
           open(run_dir.config_history_path(workdir)).read().splitlines()]
  assert [(line["step"], line["changed"], line.get("superseded_checkpoints"))
          for line in lines] == [(6, {lr: {"old": 1e-4, "new": 1e-3}}, None), (2, {}, [4, 6])]
  resume_check.record(workdir, 4, {lr: {"old": 1e-4, "new": 5e-4}})
  assert [resume_check.config_at(workdir, s)["optim"]["learning_rate"]
          for s in (2, 4, 8)] == [1e-4, 5e-4, 5e-4]
  # config.json keeps the first values; a fresh start over the workdir drops the history.
  assert run_dir.read_config(workdir)["optim"]["learning_rate"] == 1e-4
  run_dir.write_config(workdir, run_dir.read_config(workdir))
  assert run_dir.read_config_history(workdir) == []


def test_an_extension_raises_num_steps_and_nothing_else_of_the_allocation(tmp_path):
  workdir = _workdir(tmp_path)  # num_steps=4
  longer = resume_check.dotted_fields(_config(num_steps=8))
  with pytest.raises(resume_check.SettingsChanged,
                     match="different budget_rollouts=512, num_steps=4 .*--allow_changed=num_steps"):
    resume_check.check(workdir, longer, step=4)
  assert resume_check.check(workdir, longer, step=4, allow=["num_steps"]) == {
      "num_steps": {"old": 4, "new": 8},
      "budget_rollouts": {"old": 4 * 128, "new": 8 * 128}}
  # Another allocation field beside it is still refused.
  with pytest.raises(resume_check.SettingsChanged, match="different .*seed=0"):
    resume_check.check(workdir, resume_check.dotted_fields(_config(num_steps=8, seed=1)),
                          step=4, allow=["num_steps"])
  with pytest.raises(resume_check.SettingsChanged, match="an extension raises"):
    resume_check.check(workdir, resume_check.dotted_fields(_config(num_steps=2)), step=2,
                          allow=["num_steps"])
  # An off-policy pipeline sampled its last batches for the old end.
  staleness = resume_check.dotted_fields(_config(num_steps=8, **{"rl.max_staleness": 1}))
  with pytest.raises(resume_check.SettingsChanged, match="rl.max_staleness=1"):
    resume_check.check(workdir, staleness, step=4, allow=["num_steps", "rl"])
  with pytest.raises(ValueError, match="rollouts_per_problem.*cannot change"):
    resume_check.check_allowance(["num_steps", "rollouts_per_problem"])
