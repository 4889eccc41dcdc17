"""The recall task and its constructed base: problems, the pass rates the base model
gives (read by transformers and sampled by isojax), and that nothing transfers."""

import dataclasses
import importlib
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from isojax import tasks
from isojax.base_models import demo_bases, recall_base
from isojax.config import config_lib
from isojax.models import hf_checkpoint
from isojax.tasks import recall
from isojax.tasks.settings import TaskSettings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = TaskSettings(name="recall", recall_keys_per_level=4, recall_levels=3,
                     recall_answers=4, recall_min_level=1, recall_max_level=3, num_train=12,
                     num_val=12)


def _policy_path(config):
  """`demo_bases.policy_path` of a config's base model and task."""
  return demo_bases.policy_path(config.base_model.path,
                                tasks.TaskSettings.from_config(config.task))


def _run_config(arg=None):
  return importlib.import_module("isojax.configs.recall").get_config(arg)


def test_keys_levels_and_answers_follow_the_settings():
  problems = recall.all_problems(SMALL)
  assert [p.prompt for p in problems] == [f"k{i}" for i in range(12)]
  assert [p.difficulty for p in problems] == [1] * 4 + [2] * 4 + [3] * 4
  answers = [int(p.answer[1:]) for p in problems]
  assert all(p.answer == f"a{a}" for p, a in zip(problems, answers))
  assert set(answers) <= set(range(4)) and len(set(answers)) > 1
  assert recall.all_problems(SMALL) == problems  # deterministic in the seed
  other = recall.all_problems(dataclasses.replace(SMALL, seed=7))
  assert [p.answer for p in other] != [p.answer for p in problems]


def test_load_selects_the_levels_and_evaluates_on_training_keys():
  task = dataclasses.replace(SMALL, recall_min_level=2, recall_max_level=3, num_train=6,
                             num_val=3)
  data = recall.load(task)
  train, val = data.train, data.val
  assert len(train) == 6 and len({p.prompt for p in train}) == 6
  assert {p.difficulty for p in train} <= {2, 3}
  assert val == train[:3]
  everything = recall.load(dataclasses.replace(task, num_train=8, num_val=8)).train
  assert {p.prompt for p in everything} == {f"k{i}" for i in range(4, 12)}


@pytest.mark.parametrize("fields,message", [
    (dict(num_train=13), r"num_train=13: levels 1 to 3 hold only 12 keys"),
    (dict(num_val=13, num_train=12), r"num_val=13 > task.num_train=12"),
    (dict(recall_min_level=3, recall_max_level=2), r"recall_min_level=3.*1 <= min <= max"),
    (dict(recall_max_level=4), r"recall_max_level=4.*recall_levels=3"),
    (dict(recall_answers=1), r"recall_answers=1: expected at least 2"),
    (dict(recall_keys_per_level=0), r"recall_keys_per_level=0: expected a positive"),
])
def test_bad_settings_are_named(fields, message):
  with pytest.raises(ValueError, match=message):
    recall.load(dataclasses.replace(SMALL, **fields))


def test_reward_is_exact_match_of_the_answer_token():
  problem = recall.all_problems(SMALL)[0]
  wrong = "a0" if problem.answer != "a0" else "a1"
  assert recall.reward(f" {problem.answer} ", problem) == 1.0
  assert recall.reward(wrong, problem) == 0.0
  assert recall.reward(f"{problem.answer} {problem.answer}", problem) == 0.0
  assert recall.reward("", problem) == 0.0


def test_shipped_base_is_the_construction_of_the_run_configs_task():
  config = config_lib.resolve(_run_config())
  path = _policy_path(config)
  assert path == os.path.join(demo_bases.assets_root(), "recall")
  model, _ = recall_base.construct(config_lib.settings(config).task)
  shipped = hf_checkpoint.load_model(path)
  from flax import nnx  # pylint: disable=g-import-not-at-top
  built, loaded = nnx.state(model, nnx.Param), nnx.state(shipped, nnx.Param)
  for (path_a, a), (path_b, b) in zip(nnx.to_flat_state(built), nnx.to_flat_state(loaded)):
    assert path_a == path_b
    np.testing.assert_array_equal(np.asarray(a[...]), np.asarray(b[...]), err_msg=path_a)


def test_transformers_reads_the_constructed_pass_rates():
  """P(answer | key) = 2^-level and P(EOS | key, answer) = 1, computed by transformers'
  own Llama from the shipped files."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  path = os.path.join(demo_bases.assets_root(), "recall")
  hf = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
  hf_tok = transformers.AutoTokenizer.from_pretrained(path)
  task = config_lib.settings(config_lib.resolve(_run_config())).task
  problems = recall.all_problems(task)
  wrong_ids = [hf_tok.convert_tokens_to_ids(f"a{j}") for j in range(task.recall_answers)]
  ids = [[hf.config.bos_token_id, hf_tok.convert_tokens_to_ids(p.prompt),
          hf_tok.convert_tokens_to_ids(p.answer)] for p in problems]
  with torch.no_grad():
    probs = torch.softmax(hf(torch.tensor(ids)).logits.double(), -1).numpy()
  for p, row, (_, _, answer) in zip(problems, probs, ids):
    want = 2.0 ** -p.difficulty
    assert row[1, answer] == pytest.approx(want, rel=1e-5), p
    others = [i for i in wrong_ids if i != answer]
    np.testing.assert_allclose(row[1, others], (1 - want) / (task.recall_answers - 1),
                               rtol=1e-5)
    assert row[1, wrong_ids].sum() == pytest.approx(1.0, abs=1e-6)
    assert row[2, hf.config.eos_token_id] == pytest.approx(1.0, abs=1e-6)


def test_isojax_sampler_draws_the_constructed_pass_rates():
  """avg@64 per level, sampled by the profiler's sampler (the RL loop's load, prompts,
  sampler and verifier), within a 99.9% binomial interval of 2^-level."""
  from isojax.sweeps import profiling  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  s = config_lib.settings(config_lib.resolve(_run_config()))
  problems = recall.all_problems(s.task)
  options = profiling.Options(out_dir="", num_samples=64, chunk_rollouts=8192)
  sampler = profiling._Sampler(s, problems, options)  # pylint: disable=protected-access
  correct = sampler.sample(problems, 64, 8192, jax.random.key(0)).correct_G
  levels = np.array([p.difficulty for p in problems])
  for level in range(1, 9):
    draws = 64 * int((levels == level).sum())
    low, high = stats.binom.interval(0.999, draws, 2.0 ** -level)
    assert low <= correct[levels == level].sum() <= high, level


def test_training_moves_only_the_keys_it_samples(tmp_path):
  """After RL steps the block is still exactly zero, and every key never trained on has
  the base model's embedding, norm weight and head row, to the bit."""
  workdir = tmp_path / "run"
  subprocess.run([sys.executable, "-m", "isojax.main", "--config=configs/recall.py:micro",
                  f"--workdir={workdir}", "--config.num_steps=4", "--config.task.num_train=16",
                  "--config.task.num_val=16", "--config.eval.every=100"],
                 cwd=ROOT, check=True, capture_output=True)
  from isojax import export  # pylint: disable=g-import-not-at-top
  trained, _, step = export.restored_policy(str(workdir))
  assert step == 4
  base = hf_checkpoint.load_model(os.path.join(demo_bases.assets_root(), "recall"))
  config = _run_config("micro")
  config.task.update(num_train=16, num_val=16)
  task = config_lib.settings(config_lib.resolve(config)).task
  trained_keys = {int(p.prompt[1:]) for p in recall.load(task).train}
  untouched = [k for k in range(recall.num_keys(task)) if k not in trained_keys]
  for layer_weight in ("q_proj", "k_proj", "v_proj", "o_proj"):
    assert not np.any(np.asarray(getattr(trained.layers.attn, layer_weight).kernel[...]))
  for layer_weight in ("gate_proj", "up_proj", "down_proj"):
    assert not np.any(np.asarray(getattr(trained.layers.mlp, layer_weight).kernel[...]))
  rows = lambda m: (np.asarray(m.embed.embedding[...]), np.asarray(m.final_norm.weight[...]),
                    np.asarray(m.lm_head.kernel[...]))
  (e0, g0, w0), (e1, g1, w1) = rows(base), rows(trained)
  tok_ids = [3 + k for k in untouched]  # <pad>, <bos>, <eos>, then the keys in order
  np.testing.assert_array_equal(e1[tok_ids], e0[tok_ids])
  np.testing.assert_array_equal(g1[untouched], g0[untouched])
  np.testing.assert_array_equal(w1[untouched], w0[untouched])
  assert not np.array_equal(w1[sorted(trained_keys)], w0[sorted(trained_keys)])


def test_a_base_built_for_other_keys_is_refused():
  config = _run_config()
  config.task.recall_answers = 8
  with pytest.raises(ValueError, match=r"task.recall_answers=8, but .*recall was constructed "
                     r"for task.recall_answers=16"):
    _policy_path(config)


def test_build_command_constructs_the_shipped_files(tmp_path):
  out = tmp_path / "recall"
  subprocess.run([sys.executable, "-m", "launch.build_base", "--config=configs/recall.py",
                  f"--out={out}"], cwd=ROOT, check=True, capture_output=True)
  shipped = demo_bases.verify(os.path.join(demo_bases.assets_root(), "recall"))
  built = demo_bases.verify(str(out))
  assert built["files"] == shipped["files"]  # byte for byte, on any machine
  assert built["task"] == shipped["task"] == dict(
      name="recall", seed=1234, recall_keys_per_level=64, recall_levels=8,
      recall_answers=16)
