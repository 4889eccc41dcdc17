"""Prompt rendering, long-prompt dropping and bucketed padding; the task registry."""

import inspect

import numpy as np
import pytest

from isojax import tasks
from isojax.config import config_lib
from isojax.models import chat_template
from isojax.models import tokenizer as tokenizer_lib
from isojax.tasks import prompts


def _tok(template=chat_template.QWEN_CHAT_TEMPLATE):
  texts = ["What is 12 plus 30? Think step by step."] * 20
  return tokenizer_lib.train_bpe_tokenizer(
      texts, vocab_size=300, special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
      eos="<|im_end|>", pad="<|endoftext|>", chat_template=template)


@pytest.mark.parametrize("longest,max_len,expected", [
    (1, 9, 9), (9, 9, 9), (5, 100, 16), (16, 100, 16), (17, 100, 32), (33, 40, 40),
    (100, 1000, 128), (129, 1000, 256)])
def test_bucket_length(longest, max_len, expected):
  assert prompts.bucket_length(longest, max_len) == expected


def test_batch_left_pads_to_the_bucket():
  p = [tasks.Problem(f"q{i}", "a") for i in range(3)]
  book = prompts.PromptBook({p[0]: (5, 6), p[1]: tuple(range(3, 23)), p[2]: (7,)}, pad_id=0,
                            max_len=40)
  tokens, mask = book.batch([p[0], p[2]])
  np.testing.assert_array_equal(tokens[:, -2:], [[5, 6], [0, 7]])
  assert tokens.shape == (2, 16) and mask.sum(1).tolist() == [2, 1]
  assert not tokens[:, :14].any()
  tokens, mask = book.batch(p)  # 20 tokens -> the 32 bucket
  assert tokens.shape == (3, 32) and mask.sum(1).tolist() == [2, 20, 1]


def test_chat_and_plain_rendering():
  tok = _tok()
  problem = tasks.Problem("What is 12 plus 30?", "42")
  text, add_bos = prompts.render(problem, tok, fmt="chat", system_prompt="Be brief.",
                                 instruction="Think step by step.")
  assert not add_bos
  assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                  "What is 12 plus 30?\n\nThink step by step.<|im_end|>\n"
                  "<|im_start|>assistant\n")
  text, add_bos = prompts.render(problem, tok, fmt="plain", system_prompt="",
                                 instruction="")
  assert (text, add_bos) == ("What is 12 plus 30?", True)


def test_format_resolution_and_its_errors():
  task = config_lib.base_config().task
  assert prompts.resolve_format(task, _tok()) == "chat"
  assert prompts.resolve_format(task, _tok(template=None)) == "plain"
  task.prompt_format = "chat"
  with pytest.raises(ValueError, match="no chat_template"):
    prompts.resolve_format(task, _tok(template=None))


def test_build_drops_prompts_over_the_limit_and_counts_them():
  tok = _tok(template=None)
  task = config_lib.base_config().task
  short, long = tasks.Problem("hi", "1"), tasks.Problem("hi " * 50, "2")
  task.max_prompt_tokens = 10
  book, kept, dropped = prompts.build({"train": [short, long], "val": [long]}, tok, task, "")
  assert kept == {"train": [short], "val": []} and dropped == {"train": 1, "val": 1}
  assert book.max_len == len(tok.encode("hi"))
  task.max_prompt_tokens = 1
  with pytest.raises(ValueError, match="max_prompt_tokens=1"):
    prompts.build({"train": [short]}, tok, task, "")


def test_registry_names_and_errors():
  c = config_lib.base_config()
  c.num_steps = 1
  c.task.name = "gsm8k"
  with pytest.raises(ValueError, match=r"task.name='gsm8k': expected one of \['arithmetic'"):
    config_lib.resolve(c)
  c.task.update(name="math", format="gsm8k")  # no file given
  with pytest.raises(ValueError, match="train_files"):
    config_lib.resolve(c)
  c.task.name = "arithmetic"
  c.task.min_digits = 4
  with pytest.raises(ValueError, match="task.min_digits=4 > task.max_digits=3"):
    config_lib.resolve(c)


def test_default_instructions():
  task = config_lib.base_config().task
  assert tasks.default_instruction(task) == ""
  task.name = "math"
  assert "\\boxed{}" in tasks.default_instruction(task)
  task.name = "reasoning_gym"
  assert "<answer>" in tasks.default_instruction(task)
  task.instruction = "Answer briefly."
  assert tasks.default_instruction(task) == "Answer briefly."


@pytest.mark.parametrize("name", tasks.NAMES)
def test_every_family_provides_the_registry_interface_and_nothing_else_is_special(name):
  """The registry treats families alike: each module has the same four members, and
  the registry's source names no family."""
  module = tasks.family(name)
  for member in ("validate", "load", "make_verifier"):
    assert callable(getattr(module, member)), (name, member)
  assert isinstance(module.DEFAULT_INSTRUCTION, str)
  assert inspect.signature(module.load).return_annotation in ("TaskData",
                                                              "problem_lib.TaskData")
  registry = inspect.getsource(tasks)
  body = registry[registry.index("def family("):]
  assert f'"{name}"' not in body
