"""Problems -> prompt token ids, as the checkpoint expects them, with bucketed padding.

An instruct checkpoint was trained on its own chat template; a base model on plain
text. `task.prompt_format` picks: `chat` renders [system?, user] messages through the
tokenizer's `chat_template` (exactly as `transformers`' `apply_chat_template` does,
with the generation prompt appended), `plain` uses the question (and instruction) as
text, and `auto` picks `chat` whenever the checkpoint has a template.

Every prompt is rendered and tokenized once, at load time. Prompts longer than
`task.max_prompt_tokens` are dropped there and counted, never truncated silently; a
text too long to fit by its character count alone (a 50 MB row) is dropped without
being tokenized (`TextTokenizer.encode_at_most`).
Batches are left-padded to a *bucket* (the next power of two of the batch's longest
prompt, at least `MIN_BUCKET`, at most the longest prompt of the task), so one long
prompt does not set the cost of every batch while the number of compiled shapes stays
logarithmic.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from absl import logging

from isojax import tasks
from isojax.models import tokenizer as tokenizer_lib
from isojax.tasks.problem import Problem
from isojax.tasks.settings import TaskSettings

MIN_BUCKET = 16


def resolve_format(task: TaskSettings, tok) -> str:
  """`chat` or `plain` for this task and tokenizer."""
  fmt = task.prompt_format
  if fmt not in tasks.PROMPT_FORMATS:
    raise ValueError(f"task.prompt_format={fmt!r}: expected one of "
                     f"{list(tasks.PROMPT_FORMATS)}")
  if fmt == "auto":
    return "chat" if tok.chat_template else "plain"
  if fmt == "chat" and not tok.chat_template:
    raise ValueError("task.prompt_format='chat': the checkpoint's tokenizer has no "
                     "chat_template (tokenizer_config.json or chat_template.jinja); "
                     "use task.prompt_format='plain' for a base model")
  return fmt


def user_text(problem: Problem, instruction: str) -> str:
  return f"{problem.prompt}\n\n{instruction}" if instruction else problem.prompt


def render(problem: Problem, tok, *, fmt: str, system_prompt: str, instruction: str
           ) -> tuple[str, bool]:
  """(prompt text, whether the tokenizer should prepend BOS) for one problem.

  A chat template writes its own BOS where the model expects one, so chat prompts are
  tokenized without adding another (as `apply_chat_template(tokenize=True)` does).
  """
  if fmt == "plain":
    text = user_text(problem, instruction)
    return (f"{system_prompt}\n\n{text}" if system_prompt else text), True
  messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
  messages.append({"role": "user", "content": user_text(problem, instruction)})
  return tok.render_chat(messages, add_generation_prompt=True), False


def bucket_length(longest: int, max_len: int) -> int:
  """The padded prompt length of a batch whose longest prompt has `longest` tokens."""
  bucket = max(MIN_BUCKET, 1 << max(longest - 1, 0).bit_length())
  return min(bucket, max_len)


@dataclasses.dataclass
class PromptBook:
  """Token ids of every problem's rendered prompt, and batch padding."""
  ids: dict[Problem, tuple[int, ...]]
  pad_id: int
  max_len: int  # the longest prompt of the task, in tokens

  def batch(self, problems: Sequence[Problem]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [G, P] int32, mask [G, P] bool), left-padded to the batch's bucket."""
    rows = [self.ids[p] for p in problems]
    return tokenizer_lib.left_pad(rows, bucket_length(max(len(r) for r in rows), self.max_len),
                                  self.pad_id)


def build(splits: dict[str, list[Problem]], tok, task: TaskSettings,
          instruction: str) -> tuple[PromptBook, dict[str, list[Problem]], dict[str, int]]:
  """Renders and tokenizes every problem; drops those over `task.max_prompt_tokens`.

  Returns the book, the kept problems of each split and the dropped count per split.
  """
  fmt = resolve_format(task, tok)
  ids, kept, dropped = {}, {}, {}
  for name, problems in splits.items():
    kept[name], dropped[name] = [], 0
    for p in problems:
      if p not in ids:
        text, add_bos = render(p, tok, fmt=fmt, system_prompt=task.system_prompt,
                               instruction=instruction)
        # None: too long (a text far too long is refused by its length, untokenized).
        encoded = tok.encode_at_most(text, task.max_prompt_tokens, add_bos=add_bos)
        ids[p] = None if encoded is None else tuple(encoded)
      if ids[p] is None:
        dropped[name] += 1
      else:
        kept[name].append(p)
  lengths = [len(ids[p]) for problems in kept.values() for p in problems]
  if not lengths:
    raise ValueError(f"every prompt is longer than task.max_prompt_tokens="
                     f"{task.max_prompt_tokens} tokens")
  book = PromptBook({p: i for p, i in ids.items() if i is not None}, tok.pad_id, max(lengths))
  return book, kept, dropped


@dataclasses.dataclass(frozen=True)
class PromptedTask:
  """A run's problems with their rendered prompts, and what was skipped, by reason."""
  train: list[Problem]
  val: list[Problem]
  book: PromptBook
  skipped: dict[str, int]
  skipped_rows: dict[str, list[str]]  # the first few rows of each reason the loader names


def load_task(task: TaskSettings, tok, *, problems_per_batch: int) -> PromptedTask:
  """Train / validation problems with their rendered prompts (prompts over
  `task.max_prompt_tokens` are skipped and counted).

  Fails (before anything is written or compiled) when fewer training problems remain
  than a batch takes, or no validation problem does.
  """
  data = tasks.load(task)
  book, kept, dropped = build({"train": data.train, "val": data.val}, tok, task,
                              tasks.default_instruction(task))
  skipped = dict(data.skipped)
  long_prompts = dropped["train"] + dropped["val"]
  if long_prompts:
    skipped["prompt_over_max_prompt_tokens"] = long_prompts
  train, val = kept["train"], kept["val"]
  logging.info("task %s: %d training and %d validation problems; prompts up to %d tokens%s",
               task.name, len(train), len(val), book.max_len,
               f"; skipped {skipped}" if skipped else "")
  if problems_per_batch > len(train):
    raise ValueError(f"problems_per_batch={problems_per_batch} exceeds the {len(train)} "
                     f"training problems of task {task.name!r}"
                     f"{f' (split {task.split!r})' if task.split else ''}"
                     f"{f'; skipped {skipped}' if skipped else ''}")
  if not val:
    raise ValueError(f"task {task.name!r} has no validation problems"
                     f"{f' (skipped {skipped})' if skipped else ''}")
  return PromptedTask(train, val, book, skipped, data.skipped_rows)
