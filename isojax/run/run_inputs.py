"""What a run reads before it touches its workdir, every part checked: the meshes, the
policy's files and tokenizer, the task, the memory plan and the verifier.

`check_inputs(settings)` fails fast, before anything is written or compiled, with a
line naming the field or file at fault; it returns the settings as planned (the passes
left at 0 filled in by `plan_passes`). `train.run` calls it first; the benches, the
profiler and the reproduce command use `policy_path`, `checked_model_config` and
`plan_passes` to build the same model a run would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from absl import logging

from isojax import tasks
from isojax.base_models import demo_bases
from isojax.config import run_settings
from isojax.models import checkpoint_files, hf_checkpoint, sharding
from isojax.models import tokenizer as tokenizer_lib
from isojax.rl import critic as critic_lib
from isojax.rl import rollout
from isojax.run import memory_plan, resume_check
from isojax.tasks import prompts


def policy_path(s: run_settings.RunSettings) -> str:
  """`base_model.path`, or the shipped demo base model of the task (`demo_bases`)."""
  return demo_bases.policy_path(s.base_model.path, s.task)


def checked_model_config(s: run_settings.RunSettings, path: str, prompt_len: int):
  """The policy's `ModelConfig`, read from its config file, once prompt +
  `sampling.max_new_tokens` is checked against its context (raises, naming them)."""
  hf = hf_checkpoint.read_hf_config(path)
  source = hf_checkpoint.config_source(path)
  check_context(prompt_len=prompt_len, max_new_tokens=s.sampling.max_new_tokens,
                context=hf.get("max_position_embeddings"), source=source)
  return hf_checkpoint.model_config_from_hf(hf, **s.model.as_kwargs(), source=source)


def plan_passes(s: run_settings.RunSettings, path: str, prompt_len: int
                ) -> tuple[run_settings.RunSettings, memory_plan.Plan]:
  """(the settings with the passes left at 0 filled in, the plan): checks prompt +
  max_new_tokens against the model's context and sizes the micro-batch, LM-head chunk
  and sampler call from the model's shape and the memory there is (`memory_plan`);
  logs the plan. Raises, naming the fields, when the run cannot fit."""
  plan = memory_plan.for_settings(s, checked_model_config(s, path, prompt_len),
                                  prompt_len=prompt_len)
  passes = plan.passes
  planned = dataclasses.replace(
      s, rl=dataclasses.replace(s.rl, micro_batch_size=passes.micro_batch_size,
                                logprob_chunk_size=passes.logprob_chunk_size),
      sampling=dataclasses.replace(s.sampling,
                                   max_rollouts_per_call=passes.max_rollouts_per_call))
  logging.info("memory: %s", plan.describe())
  return planned, plan


@dataclasses.dataclass
class Inputs:
  """What a run reads before it touches its workdir, every part checked."""
  settings: run_settings.RunSettings  # as planned: the passes left at 0 filled in
  mesh: Any
  rollout_mesh: Any        # the generator's own devices, or None (colocated)
  path: str                # the policy's checkpoint
  tok: tokenizer_lib.TextTokenizer
  train_problems: list[tasks.Problem]
  val_problems: list[tasks.Problem]
  book: prompts.PromptBook
  skipped: dict[str, int]
  skipped_rows: dict[str, list[str]]
  requested: dict[str, Any]  # the settings as set, before the plan fills in passes
  verifier: Any
  plan: memory_plan.Plan     # the passes and the estimated peak memory


def check_inputs(s: run_settings.RunSettings) -> Inputs:
  """The mesh, model files, tokenizer, task, memory plan and verifier; fails fast,
  before anything is written."""
  mesh, rollout_mesh = sharding.make_meshes(s.mesh.as_kwargs())
  path = policy_path(s)
  try:
    hf_checkpoint.check_files(path, **s.model.as_kwargs())  # headers and sizes; no weights
    tok = tokenizer_lib.load_tokenizer(path, extra_stop_ids=s.sampling.stop_token_ids)
  except (ValueError, OSError) as e:  # each names its file: one line for the user
    raise checkpoint_files.CheckpointFileError(str(e)) from e
  rollout.interruption(s.sampling, tok)  # its text must fit the tokenizer
  critic_lib.check_vocabulary(s.critic, s.model, path)  # a loaded critic reads the policy's tokens
  task = prompts.load_task(s.task, tok, problems_per_batch=s.problems_per_batch)
  requested = resume_check.dotted_fields(s.to_dict())  # as set: before the plan's passes
  planned, plan = plan_passes(s, path, task.book.max_len)  # the context and memory
  return Inputs(planned, mesh, rollout_mesh, path, tok, task.train, task.val, task.book,
                 task.skipped, task.skipped_rows, requested, tasks.make_verifier(s.task), plan)


def check_context(*, prompt_len: int, max_new_tokens: int, context: int | None,
                  source: str) -> None:
  """Refuses prompts plus `max_new_tokens` beyond the model's context, naming fields."""
  if context and prompt_len + max_new_tokens > context:
    raise ValueError(
        f"sampling.max_new_tokens={max_new_tokens} after prompts of up to {prompt_len} tokens "
        f"(task.max_prompt_tokens caps them) exceeds the model's context of {context} "
        f"positions ({source}); expected prompt + max_new_tokens <= {context}: lower "
        f"sampling.max_new_tokens to {max(context - prompt_len, 0)} or less")
