"""The task's settings (`config.task`): typed, JAX-free, each field with its default and
meaning (`validation.field`).

`TaskSettings` checks the fields every family shares; each family checks its own in
`validate` (`isojax.tasks.validate`), importing `datasets` or reasoning-gym only when
used.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from isojax import validation

F = validation.field

# `task.prompt_format`: the checkpoint's chat template whenever it has one, the template,
# or plain text (`isojax.tasks.prompts`).
PROMPT_FORMATS = ("auto", "chat", "plain")


@dataclasses.dataclass(frozen=True)
class TaskSettings(validation.Section):
  """`config.task`: the problems, their prompts and their grading ([tasks.md](tasks.md))."""
  name: str = F("arithmetic", "task family: `arithmetic`, `reasoning_gym`, `math`, "
                "`recall`")
  min_digits: int = F(1, "arithmetic: the fewest operand digits (the difficulty knob)")
  max_digits: int = F(3, "arithmetic: the most operand digits")
  recall_keys_per_level: int = F(64, "recall: keys (problems) of each difficulty level")
  recall_levels: int = F(8, "recall: levels; the base model answers a level-l key right "
                         "with probability 2^-l")
  recall_answers: int = F(16, "recall: answer tokens a key's answer is drawn from")
  recall_min_level: int = F(1, "recall: the easiest level trained on")
  recall_max_level: int = F(8, "recall: the hardest level trained on")
  num_train: int = F(2048, "training problems (math: a cap, 0 = all)")
  num_val: int = F(256, "validation problems (math: held out, or a cap on a separate "
                   "source)")
  max_train_problems: int = F(0, "> 0: train on the first this-many of a fixed shuffle (by "
                              "`seed`), whatever the source: the problem-set-size "
                              "experiment's knob")
  seed: int = F(1234, "the problem draw and splits")
  split: str = F("", "a profiled split's name (`launch.profile`); `\"\"` uses the family's "
                 "own problems")
  splits_dir: str = F("~/.cache/isojax/splits", "where split files live (local or `gs://`)")
  dataset: str = F("", "reasoning_gym: dataset name")
  dataset_kwargs: dict[str, Any] = F({}, "reasoning_gym: the dataset's keyword arguments "
                                     "(free-form)")
  format: str = F("generic", "math: column mapping (`generic`, `gsm8k`, `math`, `dapo`, "
                  "`polaris`, `deepscaler`)")
  train_files: str = F("", "math: comma-separated JSONL / JSON / Parquet / CSV / Arrow "
                       "files or globs (a comma inside a name: `\\,`), or one "
                       "`save_to_disk` directory")
  val_files: str = F("", "math: the same for validation; `\"\"` holds out `num_val` "
                     "training problems (deterministic in `seed`)")
  tfds_name: str = F("", "math: a TFDS dataset prepared under `data_dir`")
  data_dir: str = F("", "math: the TFDS data directory")
  train_split: str = F("train", "math: the training split's name in a DatasetDict or TFDS "
                       "dataset")
  val_split: str = F("", "math: the validation split's name; `\"\"`: held out from "
                     "training")
  question_field: str = F("", "math: the question column (`generic`), or an override of a "
                          "format's")
  answer_field: str = F("", "math: the answer column (`generic`), or an override of a "
                        "format's")
  answer_pattern: str = F("", "regex with a capture group around the answer; `\"\"` = the "
                          "family's default")
  binary_reward: bool = F(False, "reasoning_gym: pay only full marks")
  prompt_format: str = F("auto", "`auto` (chat template when the checkpoint has one), "
                         "`chat`, `plain`")
  system_prompt: str = F("", "system message (chat) or leading paragraph (plain)")
  instruction: str | None = F(None, "text after each question; None = the family's "
                              "default", kind=str)
  max_prompt_tokens: int = F(1024, "longer prompts are dropped and counted at load time")
  verifier_timeout_s: float = F(5.0, "math: per-completion grading timeout; a timeout "
                                "scores 0 and counts in `train/verifier_timeouts`")
  verifier_workers: int = F(0, "math: grading processes; 0 = min(4, CPU count)")

  def __post_init__(self):
    validation.choice("task.prompt_format", self.prompt_format, PROMPT_FORMATS)
    if not self.verifier_timeout_s > 0:
      raise ValueError(f"task.verifier_timeout_s={self.verifier_timeout_s}: expected > 0")
    validation.non_negative_int("task.verifier_workers", self.verifier_workers,
                                "0 = min(4, CPU count)")
    validation.positive_int("task.max_prompt_tokens", self.max_prompt_tokens)
    validation.non_negative_int("task.max_train_problems", self.max_train_problems,
                                "0: every training problem")
