"""Difficulty profiling: the base model's per-problem pass rates and the paper's splits.

Samples a pool of candidate problems with the base model (loaded exactly as the RL
loop loads it), measures each one's avg@k (and pass@hard_samples of those at 0), and
writes the splits `isojax.tasks.difficulty` selects from the pass-rate bands, each with
a held-out in-domain validation set.

Arithmetic pools come from `arithmetic.draw_problems`: validation problems from the
task's validation partition (a hash of the prompt), which the tiny base model never
saw and which no training problem is in, so train and validation are disjoint by
construction. Results are cached: a split whose file already holds the same
`settings` (model path, sampling, pool, sizes, bands) is not recomputed, and a profile
stopped part-way resumes from the chunks it measured (`profile_journal`). Split files
may live on gs:// (`isojax.storage`). `launch.profile` is the command line;
`launch.study` calls `profile` directly.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from isojax import storage, tasks
from isojax.config import config_lib, run_settings
from isojax.models import hf_checkpoint, sharding
from isojax.models import tokenizer as tokenizer_lib
from isojax.run import evaluation, memory_estimates, memory_plan, run_inputs
from isojax.sweeps import profile_journal
from isojax.tasks import arithmetic, prompts, splits
from isojax.tasks.difficulty import BANDS, EXTREMELY_HARD, SPLITS, ProblemRates, SplitPlan
from isojax.tasks.difficulty import plan_splits

PROFILE_FILE = splits.PROFILE_FILE
_VERSION = 1                    # bump when the selection rules (isojax.tasks.difficulty) change


class ProfileError(ValueError):
  """A split could not be made (names the split and the counts)."""


@dataclasses.dataclass(frozen=True)
class Options:
  out_dir: str                      # where the split files go (a config's task.splits_dir)
  num_samples: int = 16             # k of avg@k, the difficulty measure
  hard_samples: int = 128           # further samples for the extremely hard split
  pool_size: int = 8192             # candidate training problems
  val_pool_size: int = 4096         # candidate validation problems (disjoint partition)
  # Every difficulty the shipped arithmetic base was trained on (its build's sft_max_digits):
  # 4-digit sums all have avg@16 = 0 and would fill the hard splits with problems no
  # RL run on this base model can learn.
  min_digits: int = 1
  max_digits: int = 3
  num_train: int = 512              # training problems per split
  num_val: int = 256                # validation problems per split
  seed: int = 0                     # the pool and the sampling keys
  chunk_rollouts: int = 4096        # rollouts per sampler call
  splits: tuple[str, ...] = tuple(SPLITS)
  force: bool = False


def model_path(config: ml_collections.ConfigDict | run_settings.RunSettings) -> str:
  """The base model directory `run_inputs.policy_path` gives."""
  return os.path.abspath(run_inputs.policy_path(config_lib.as_settings(config)))


def settings(s: run_settings.RunSettings, options: Options) -> dict[str, Any]:
  """Everything that determines the splits: equal settings, equal files.

  Round-tripped through JSON (tuples become lists) so it compares equal to what a
  split file holds.
  """
  sections = s.to_dict()
  return json.loads(json.dumps(dict(
      version=_VERSION, model=model_path(s), sampling=sections["sampling"],
      model_dtype=s.model.dtype, num_samples=options.num_samples,
      hard_samples=options.hard_samples, pool_size=options.pool_size,
      val_pool_size=options.val_pool_size, min_digits=options.min_digits,
      max_digits=options.max_digits, num_train=options.num_train, num_val=options.num_val,
      seed=options.seed, bands={k: dataclasses.asdict(b) for k, b in BANDS.items()},
      **({} if s.task.name == "arithmetic" else dict(task=sections["task"])))))


def _check_options(options: Options) -> None:
  unknown = [s for s in options.splits if s not in SPLITS]
  if unknown or not options.splits:
    raise ProfileError(f"splits={list(options.splits)}: expected names from {list(SPLITS)}")
  for field in ("num_samples", "hard_samples", "pool_size", "val_pool_size", "num_train",
                "num_val", "chunk_rollouts", "min_digits"):
    if getattr(options, field) < 1:
      raise ProfileError(f"{field}={getattr(options, field)}: expected a positive integer")
  if options.min_digits > options.max_digits:
    raise ProfileError(f"min_digits={options.min_digits} > max_digits={options.max_digits}")


def cached(s: run_settings.RunSettings, options: Options) -> bool:
  """True when every requested split file exists with these settings."""
  want = settings(s, options)
  for name in options.splits:
    if not splits.split_path(options.out_dir, name).is_file():
      return False
    try:
      if splits.read_split_meta(options.out_dir, name).get("settings") != want:
        return False
    except (ValueError, KeyError, TypeError):  # unreadable: make it again
      return False
  return True


# --- Sampling (devices) ----------------------------------------------------------


class _Sampler:
  """The base policy, its prompts and verifier, and a correct-count function."""

  def __init__(self, s: run_settings.RunSettings, problems: Sequence[tasks.Problem],
               options: Options):
    mesh = sharding.make_mesh(s.mesh.as_kwargs())
    path = run_inputs.policy_path(s)
    self.tok = tokenizer_lib.load_tokenizer(
        path, extra_stop_ids=tuple(s.sampling.stop_token_ids))
    self.book, kept, dropped = prompts.build({"pool": list(problems)}, self.tok, s.task,
                                             tasks.default_instruction(s.task))
    if dropped["pool"]:
      raise ProfileError(f"{dropped['pool']} pool problems have prompts longer than "
                         f"task.max_prompt_tokens={s.task.max_prompt_tokens}")
    # The sampler's calls sized from the memory there is (left at 0, a whole chunk of
    # --chunk_rollouts would be one call); the context is checked and a problem's samples
    # that cannot fit are refused here, before the model loads or anything is sampled.
    model_cfg = run_inputs.checked_model_config(s, path, self.book.max_len)
    self.sampling = s.sampling
    if not s.sampling.max_rollouts_per_call:
      shape = memory_estimates.Shape.of(model_cfg)
      self.sampling = dataclasses.replace(s.sampling, max_rollouts_per_call=(
          memory_plan.sampler_calls(
              shape, rollouts=options.chunk_rollouts,
              group=max(options.num_samples, options.hard_samples),
              prompt_len=self.book.max_len, max_new_tokens=s.sampling.max_new_tokens,
              cast_bytes=memory_plan.sample_weight_bytes(s, shape))))
      logging.info("profile sampler calls of %s rollouts",
                   self.sampling.max_rollouts_per_call or "every")
    self.verifier = tasks.make_verifier(s.task)
    policy = hf_checkpoint.load_model(path, mesh, **s.model.as_kwargs())
    self.graphdef, self.params = nnx.split(policy)

  def sample(self, problems, num_samples: int, chunk_rollouts: int, rng, *,
             journal: profile_journal.Journal | None = None, name: str = ""
             ) -> evaluation.SampleCounts:
    """The counts of `problems`; with a `journal`, pass `name`'s chunks in it are taken
    from there and the others sampled and recorded in it."""
    if not problems:
      empty = np.zeros((0, num_samples), np.int64)
      return evaluation.SampleCounts(np.zeros(0, np.int64), empty, empty.astype(bool))
    chunk = max(1, min(len(problems), chunk_rollouts // num_samples))
    return evaluation.correct_counts(
        self.graphdef, self.params, self.tok, self.book, problems, self.verifier,
        num_samples=num_samples, chunk=chunk, rng=rng, sampling=self.sampling,
        done=journal.done(name) if journal else None,
        on_chunk=journal.recorder(name) if journal else None)


def _measure(sampler: _Sampler, problems, options: Options, rng, need_extremely_hard: int,
             journal: profile_journal.Journal, name: str) -> ProblemRates:
  """avg@k of every problem; pass@hard_samples of avg@k = 0 ones until enough are found.
  `name` names the pool's passes in `journal`."""
  samples = sampler.sample(problems, options.num_samples, options.chunk_rollouts,
                           jax.random.fold_in(rng, 0), journal=journal, name=name)
  correct = samples.correct_G
  hard = np.full(len(problems), -1, np.int64)
  if need_extremely_hard:
    zeros = np.flatnonzero(correct == 0)
    step = max(1, options.chunk_rollouts // options.hard_samples)
    found = 0
    for i, start in enumerate(range(0, len(zeros), step)):
      idx = zeros[start:start + step]
      hard[idx] = sampler.sample([problems[j] for j in idx], options.hard_samples,
                                 options.chunk_rollouts, jax.random.fold_in(rng, 1 + i),
                                 journal=journal, name=f"{name}_hard_{i}").correct_G
      found += int(np.count_nonzero(hard[idx] == 0))
      if found >= need_extremely_hard:
        break
  return ProblemRates(list(problems), correct, hard, options.num_samples,
                      samples.lengths_GN, samples.truncated_GN)


# --- The whole job ---------------------------------------------------------------------


@dataclasses.dataclass
class SplitSummary:
  name: str
  num_train: int
  num_val: int
  train_pass_rate: float     # mean avg@k of the base model
  val_pass_rate: float
  path: str
  digits: dict[int, float]   # fraction of training problems per operand digit count


def _digit_mix(difficulties: Sequence[int]) -> dict[int, float]:
  values, counts = np.unique(np.asarray(difficulties), return_counts=True)
  return {int(v): float(c) / len(difficulties) for v, c in zip(values, counts)}


def _task_pool(s: run_settings.RunSettings, options: Options
               ) -> tuple[list[tasks.Problem], list[tasks.Problem]]:
  """The candidate pools of a loaded family (reasoning_gym, math): the first pool_size
  training and val_pool_size validation problems of the task (disjoint by the task)."""
  data = tasks.load(s.task)
  train_pool, val_pool = data.train[:options.pool_size], data.val[:options.val_pool_size]
  if len(train_pool) < options.pool_size or len(val_pool) < options.val_pool_size:
    logging.warning("task %s has %d training and %d validation problems; profiling "
                    "pools of %d and %d", s.task.name, len(data.train), len(data.val),
                    len(train_pool), len(val_pool))
  return train_pool, val_pool


def _pool(options: Options) -> tuple[list[tasks.Problem], list[tasks.Problem]]:
  """Distinct arithmetic candidates, deterministic in seed: training ones, and validation
  ones from the task's validation partition (which the base model never trained on)."""
  try:
    return arithmetic.draw_problems(options.seed, options.pool_size, options.val_pool_size,
                                    options.min_digits, options.max_digits)
  except ValueError as e:
    raise ProfileError(f"pool_size={options.pool_size}, val_pool_size="
                       f"{options.val_pool_size}: {e}; widen the digit range or lower the "
                       "pool sizes") from e


def profile(config: ml_collections.ConfigDict | run_settings.RunSettings, options: Options
            ) -> list[SplitSummary]:
  """Measures the pool and writes the splits (or reuses them); returns their summary.
  A ConfigDict (the command line's, a notebook's) is resolved once, here."""
  _check_options(options)
  s = config_lib.as_settings(config)
  want = settings(s, options)
  if not options.force and cached(s, options):
    logging.info("splits %s in %s are up to date (same model and settings); reusing them",
                 ", ".join(options.splits), options.out_dir)
    return [_summary_from_file(options.out_dir, name) for name in options.splits]

  start = time.time()
  train_pool, val_pool = (_pool(options) if s.task.name == "arithmetic"
                          else _task_pool(s, options))
  sampler = _Sampler(s, train_pool + val_pool, options)
  # What else decides each chunk's counts: its size and the sampler's calls.
  journal = profile_journal.Journal(options.out_dir, dict(
      settings=want, chunk_rollouts=options.chunk_rollouts,
      max_rollouts_per_call=sampler.sampling.max_rollouts_per_call))
  rng = jax.random.key(options.seed)
  wants_xh = any(EXTREMELY_HARD in SPLITS[s] for s in options.splits)
  train_rates = _measure(sampler, train_pool, options, jax.random.fold_in(rng, 0),
                         options.num_train if wants_xh else 0, journal, "train")
  val_rates = _measure(sampler, val_pool, options, jax.random.fold_in(rng, 1),
                       options.num_val if wants_xh else 0, journal, "val")
  logging.info("measured %d + %d problems in %.1f s", len(train_pool), len(val_pool),
               time.time() - start)
  _write_profile(options.out_dir, want, train_rates, val_rates)

  plans, empty = plan_splits(train_rates, val_rates, options.splits, options.num_train,
                             options.num_val)
  summaries = []
  for plan in plans:
    if (len(plan.train) < options.num_train or len(plan.val) < options.num_val):
      logging.warning(
          "split %s: only %d of %d training and %d of %d validation problems (available "
          "per class: train %s, val %s); writing what exists", plan.name, len(plan.train),
          options.num_train, len(plan.val), options.num_val, plan.available_train,
          plan.available_val)
    summaries.append(_write_split(options, want, plan, train_rates, val_rates))
  journal.remove()  # everything it held is in profile.json and the splits
  if empty:
    raise ProfileError(
        "empty split(s): " + "; ".join(empty) + ". The base model has no problems in "
        "these bands: widen --min_digits/--max_digits or raise --pool_size")
  return summaries


def _pass_rate_metric(name: str, options: Options) -> str:
  if name == EXTREMELY_HARD:
    return f"avg@{options.hard_samples} (pass@{options.hard_samples} = 0)"
  return f"avg@{options.num_samples}"


def _write_split(options: Options, want: dict[str, Any], plan: SplitPlan,
                 train_rates: ProblemRates, val_rates: ProblemRates) -> SplitSummary:
  name, train_idx, val_idx = plan.name, plan.train, plan.val
  xh = name == EXTREMELY_HARD
  rates = {}
  for r, idx in ((train_rates, train_idx), (val_rates, val_idx)):
    for i in idx:
      rates[r.problems[i].prompt] = (
          float(r.hard_correct_G[i]) / options.hard_samples if xh else float(r.rate_G[i]))
  composition = SPLITS[name]
  meta = dict(
      settings=want, model=want["model"], num_samples=options.num_samples,
      hard_samples=options.hard_samples if xh else None,
      pass_rate=_pass_rate_metric(name, options), composition=composition,
      thresholds={c: ({"avg": [0.0, 0.0], "extra_correct": 0} if c == EXTREMELY_HARD
                      else dataclasses.asdict(BANDS[c])) for c in composition},
      counts=dict(requested_train=options.num_train, requested_val=options.num_val,
                  num_train=len(train_idx), num_val=len(val_idx),
                  available_train=plan.available_train, available_val=plan.available_val),
      created=time.strftime("%Y-%m-%dT%H:%M:%S"))
  path = splits.save_split(options.out_dir, name,
                           [train_rates.problems[i] for i in train_idx],
                           [val_rates.problems[i] for i in val_idx], rates, meta)
  return SplitSummary(name, len(train_idx), len(val_idx),
                      float(np.mean([train_rates.rate_G[i] for i in train_idx])),
                      float(np.mean([val_rates.rate_G[i] for i in val_idx])), os.fspath(path),
                      _digit_mix([train_rates.problems[i].difficulty for i in train_idx]))


def _write_profile(out_dir: str, want: dict, train_rates: ProblemRates,
                   val_rates: ProblemRates) -> None:
  """Every measured problem's pass rates, for inspection (not read back)."""
  def rows(r: ProblemRates):
    out = [dict(prompt=p.prompt, answer=p.answer, difficulty=p.difficulty,
                correct=int(c), hard_correct=None if h < 0 else int(h))
           for p, c, h in zip(r.problems, r.correct_G, r.hard_correct_G)]
    if r.lengths_GN is not None:  # each sample's generated tokens, and how many were cut
      for row, lengths_N, cut_N in zip(out, r.lengths_GN, r.truncated_GN):
        row.update(lengths=[int(x) for x in lengths_N], truncated=int(cut_N.sum()))
    return out
  storage.write_json(storage.path(out_dir) / PROFILE_FILE,
                     dict(settings=want, train=rows(train_rates), val=rows(val_rates)), indent=0)


def _summary_from_file(out_dir: str, name: str) -> SplitSummary:
  path = splits.split_path(out_dir, name)
  payload = storage.read_json(path)
  if name == EXTREMELY_HARD:  # its stored rate is pass@128's; avg@k is 0 by definition
    train_rate = val_rate = 0.0
  else:
    train_rate = float(np.mean([r["pass_rate"] for r in payload["train"]]))
    val_rate = float(np.mean([r["pass_rate"] for r in payload["val"]]))
  return SplitSummary(name, len(payload["train"]), len(payload["val"]), train_rate,
                      val_rate, os.fspath(path),
                      _digit_mix([r["difficulty"] for r in payload["train"]]))


def format_table(summaries: Sequence[SplitSummary], num_samples: int) -> str:
  """The split sizes and the base model's mean avg@k, as a fixed-width table."""
  header = (f"{'split':<24}{'train':>7}{'val':>6}  {'train avg@' + str(num_samples):>13}  "
            f"{'val avg@' + str(num_samples):>11}  {'train digits':<24}file")
  lines = [header, "-" * len(header)]
  for s in summaries:
    digits = " ".join(f"{d}:{f:.0%}" for d, f in sorted(s.digits.items()))
    lines.append(f"{s.name:<24}{s.num_train:>7}{s.num_val:>6}  {s.train_pass_rate:>13.3f}  "
                 f"{s.val_pass_rate:>11.3f}  {digits:<24}{s.path}")
  return "\n".join(lines)


def pool_table(out_dir: str) -> str:
  """Per difficulty: problems, mean avg@k and the fraction in each class (profile.json)."""
  return splits.pool_table(out_dir)
