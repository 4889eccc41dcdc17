"""A `math` run on a GSM8K-format JSONL file with a random-weight Qwen2 checkpoint.

The checkpoint is what a user brings: built with `transformers`, a byte-level BPE
tokenizer with a Qwen-style chat template in tokenizer_config.json, and two
end-of-sequence ids in generation_config.json. Prompts must be exactly what
`transformers`' `apply_chat_template` gives, generation must stop at either id, and the
run must go end to end with math-verify grading.
"""

import json

import jax
import ml_collections
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from isojax import run_dir, tasks  # pylint: disable=g-import-not-at-top
from isojax.config import config_lib
from isojax.models import chat_template, hf_checkpoint  # pylint: disable=g-import-not-at-top
from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
from isojax.rl import rollout  # pylint: disable=g-import-not-at-top
from isojax.run import train
from isojax.tasks import math_data, math_verifier, prompts  # pylint: disable=g-import-not-at-top
from flax import nnx  # pylint: disable=g-import-not-at-top

QUESTIONS = [(f"Tom has {a} apples and buys {b} more. How many apples does he have?", a + b)
             for a, b in [(3, 4), (10, 5), (7, 8), (12, 30), (2, 2), (9, 1), (6, 6), (11, 4),
                          (20, 22), (5, 13), (8, 8), (1, 99)]]


def _gsm8k_file(path):
  """The QUESTIONS as GSM8K rows, then row 13: an answer without `####` (skipped)."""
  with open(path, "w") as f:
    for q, a in QUESTIONS:
      f.write(json.dumps({"question": q, "answer": f"{a - 1} + 1 = {a}\n#### {a:,}"}) + "\n")
    f.write(json.dumps({"question": "No marker?", "answer": "just 3"}) + "\n")
  return str(path)


def _checkpoint(path):
  """Random Qwen2 weights, a trained BPE with a chat template, two EOS ids."""
  texts = [q for q, _ in QUESTIONS] * 4 + ["The answer is \\boxed{42}. Let me think."]
  tok = tokenizer_lib.train_bpe_tokenizer(
      texts, vocab_size=300, special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
      eos="<|im_end|>", pad="<|endoftext|>", chat_template=chat_template.QWEN_CHAT_TEMPLATE)
  im_end, endoftext = tok.eos_id, tok.pad_id
  torch.manual_seed(0)
  cfg = transformers.Qwen2Config(
      vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
      tie_word_embeddings=False, eos_token_id=endoftext, bos_token_id=endoftext,
      pad_token_id=endoftext)
  model = transformers.Qwen2ForCausalLM(cfg).eval()
  with torch.no_grad():  # flat logits: every token, both stop ids included, is likely
    model.lm_head.weight.mul_(0.01)
  model.save_pretrained(path, safe_serialization=True)
  tok.save(str(path))
  (path / "generation_config.json").write_text(json.dumps(
      {"eos_token_id": [im_end, endoftext], "pad_token_id": endoftext}))
  return str(path), (im_end, endoftext)


def _config(ckpt, data, workdir_cache):
  c = config_lib.base_config()
  c.base_model.path = ckpt
  c.task.update(name="math", format="gsm8k", train_files=data, num_train=0, num_val=4,
                system_prompt="You are a careful solver.", verifier_workers=1,
                splits_dir=str(workdir_cache))
  c.update(rollouts_per_problem=4, problems_per_batch=4, num_steps=2, checkpoint_every=2)
  c.sampling.update(max_new_tokens=12, temperature=1.0)
  c.eval.update(every=2, num_samples=4, k=2, train_problems=4)
  return c


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("real")
  ckpt, stops = _checkpoint(root / "ckpt")
  return ckpt, stops, _gsm8k_file(root / "gsm8k.jsonl"), root


def test_prompts_are_what_transformers_renders(setup):
  ckpt, _, data, root = setup
  config = config_lib.resolve(_config(ckpt, data, root))
  tok = tokenizer_lib.load_tokenizer(ckpt)
  run_settings = config_lib.settings(config)
  loaded = prompts.load_task(
      run_settings.task, tok,
      problems_per_batch=run_settings.problems_per_batch)
  train_problems, val_problems, book = loaded.train, loaded.val, loaded.book
  skipped, skipped_rows = loaded.skipped, loaded.skipped_rows
  assert skipped == {"train/missing_answer": 1}
  assert skipped_rows == {"train/missing_answer": [f"{data} row 13"]}
  assert len(train_problems) == 8 and len(val_problems) == 4
  hf_tok = transformers.AutoTokenizer.from_pretrained(ckpt)
  for p in train_problems[:3] + val_problems[:1]:
    messages = [{"role": "system", "content": "You are a careful solver."},
                {"role": "user", "content": f"{p.prompt}\n\n{math_data.DEFAULT_INSTRUCTION}"}]
    expected = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    expected = list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert list(book.ids[p]) == expected
  # Gold answers come from after "####", thousands separators dropped.
  golds = {p.prompt: p.answer for p in train_problems + val_problems}
  assert golds[QUESTIONS[9][0]] == "18" and golds[QUESTIONS[-1][0]] == "100"


def test_generation_stops_at_either_eos_id(setup):
  ckpt, (im_end, endoftext), data, root = setup
  config = config_lib.resolve(_config(ckpt, data, root))
  tok = tokenizer_lib.load_tokenizer(ckpt)
  assert tok.eos_ids == (im_end, endoftext)
  run_settings = config_lib.settings(config)
  loaded = prompts.load_task(
      run_settings.task, tok,
      problems_per_batch=run_settings.problems_per_batch)
  train_problems, book = loaded.train, loaded.book
  graphdef, params = nnx.split(hf_checkpoint.load_model(ckpt))
  sampling = ml_collections.ConfigDict(dict(config.sampling.to_dict(), temperature=1.0,
                                            max_new_tokens=48))
  scored = rollout.generate(graphdef, params, tok, book, train_problems[:8],
                            tasks.PerItemVerifier(lambda text, p: 0.0), n=16,
                            rng=jax.random.key(0), sampling=sampling)
  r = scored.rollouts
  ended_by = {im_end: 0, endoftext: 0}
  for tokens, mask, finished in zip(r.tokens, r.mask, r.finished):
    length = int(mask.sum())
    generated = tokens[:length].tolist()
    stops_inside = [t for t in generated[:-1] if t in ended_by]
    assert not stops_inside, "generation ran past a stop id"
    assert bool(finished) == (generated[-1] in ended_by)
    if finished:
      ended_by[generated[-1]] += 1
    else:
      assert length == 48
  assert ended_by[im_end] > 0 and ended_by[endoftext] > 0, ended_by


@pytest.mark.slow("a math run on a random Qwen2 checkpoint, as a subprocess")
def test_math_run_end_to_end(setup, tmp_path):
  ckpt, _, data, root = setup
  final = train.run(_config(ckpt, data, root), str(tmp_path / "run"))
  lines = run_dir.read_metrics(str(tmp_path / "run"))
  assert [l["step"] for l in lines] == [0, 1, 2]
  # The first line says what the loader skipped, and where.
  assert lines[0]["task/skipped/train/missing_answer"] == 1
  assert lines[0]["task/skipped_rows/train/missing_answer"] == [f"{data} row 13"]
  for key in ("train/verifier_timeouts", "train/verifier_errors", "train/truncated_fraction"):
    assert lines[-1][key] >= 0
  assert 0 <= final["val/avg@2"] <= 1 and 0 <= final["val/truncated_fraction"] <= 1
  # The run's verifier is math-verify's: equivalent forms of a gold answer count.
  verifier = tasks.make_verifier(config_lib.resolve(_config(ckpt, data, root)).task)
  assert isinstance(verifier, math_verifier.MathVerifier)
  try:
    grades = verifier.grade(["so \\boxed{\\frac{14}{2}}", "\\boxed{7.0}", "\\boxed{8}"],
                            [tasks.Problem("q", "7")] * 3)
  finally:
    verifier.close()
  np.testing.assert_array_equal(grades.rewards, [1, 1, 0])


def test_too_few_problems_fail_before_writing(setup, tmp_path):
  ckpt, _, data, root = setup
  config = _config(ckpt, data, root)
  config.problems_per_batch = 9  # 12 problems - 4 held out = 8
  with pytest.raises(ValueError, match="problems_per_batch=9 exceeds the 8 training"):
    train.run(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_long_prompts_are_dropped_and_counted(setup):
  ckpt, _, data, root = setup
  config = _config(ckpt, data, root)
  tok = tokenizer_lib.load_tokenizer(ckpt)
  config.task.max_prompt_tokens = 10_000
  run_settings = config_lib.settings(config_lib.resolve(config))
  book = prompts.load_task(
      run_settings.task, tok,
      problems_per_batch=run_settings.problems_per_batch).book
  token_lengths = sorted(len(ids) for ids in book.ids.values())
  config.task.max_prompt_tokens = token_lengths[-3]  # the two longest prompts go
  config.problems_per_batch = 2
  run_settings = config_lib.settings(config_lib.resolve(config))
  loaded = prompts.load_task(run_settings.task, tok,
                             problems_per_batch=run_settings.problems_per_batch)
  train_problems, val_problems, skipped = loaded.train, loaded.val, loaded.skipped
  longer = sum(l > token_lengths[-3] for l in token_lengths)
  assert skipped == {"prompt_over_max_prompt_tokens": longer, "train/missing_answer": 1}
  assert len(train_problems) + len(val_problems) == 12 - longer
