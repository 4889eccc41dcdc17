r"""Throughput benchmark: isojax's sampler and update against Hugging Face, same weights.

    python -m launch.bench --out=/tmp/bench.json
    python -m launch.bench --hidden=512 --layers=8 --workloads=32x8x64x64 --repeats=5

One random-weight Qwen2-shaped checkpoint is written (`isojax.bench.ours`) and loaded
by isojax and, when the sampling section runs, by `transformers` and Tunix, so the sides
run the same weights (checked: greedy continuations agree). Each section is one module
of `isojax.bench`; torch is imported only by the one that measures Hugging Face. In one
process it measures
  1. sampling: `sampler.sample` (jitted) against `generate` (torch, do_sample, no EOS,
     so every rollout has exactly T tokens) on each --workloads entry G x n x P x T
     (G prompts, n rollouts each, P prompt tokens, T new tokens); Tunix if importable;
  2. the shared prompt cache: isojax at several n for the same G * n rollouts;
  3. length-skewed batches (--skew_rows rows, G = rows / n prompts for each n of
     --skew_n): greedy prompts chosen so ~90% of rows emit a stop id after T / 8 tokens
     and the rest run to T; the static while_loop executes every row until
     the longest finishes, and the waste is 1 - useful / executed decode slots; against
     it, continuous batching in --skew_slots slots, and the same halving its slots down
     to --skew_min_slots as the queue drains (`sampling.decode_slots_min`); the
     prompts' prefill, which every side pays, is timed alone too, so the gain of the
     decoding alone is printed beside that of the whole call;
  4. long outputs: attention over the whole preallocated generated cache at every step
     against blocked attention over its filled part (`sampling.decode_block`);
  5. the update (`update.train_step`): tokens/s, model FLOP/s and its fraction of the
     measured peak of a jitted float32 matmul; with --update_profile=DIR, one traced
     step's seconds by kind of operation and the matmul kernels' own rate
     (`isojax.bench.op_profile`);
  6. one RL step of the default preset, broken down into its phases (`isojax.bench.rl_step`);
  7. decode against the memory-bandwidth roofline (`isojax.bench.roofline`), per workload of
     --roofline: bytes of weights and KV cache read per step / step time, against a
     measured copy bandwidth and the device's nominal one where known;
  8. LoRA sampling (`isojax.bench.lora_sampling`): the adapted model against the same
     weights merged, on --lora_workload, and the share of greedy tokens they agree on;
  9. trl, only when asked for (`isojax.bench.trl_step`): isojax's whole RL step against
     TRL's GRPOTrainer on a real model (--trl_config, default configs/smollm2.py:bench), the
     same problems, allocation and loss, each side in its own process, --trl_rounds
     alternations of --trl_steps steps; with --tunix_python (the interpreter of an
     environment that has google-tunix), Tunix's GRPO learner as a third side
     (`isojax.bench.tunix_step`; docs/performance.md says how to set it up).
Tokens/s = generated (or trained) tokens / wall seconds of one call, median of
--repeats rounds after a warm-up call (the sides of a comparison called in turn in each
round); compile = warm-up minus that median. --sections picks what runs, e.g. on a GPU:

    python -m launch.bench --sections=roofline --roofline_dtype=bfloat16 \
        --hidden=1536 --layers=28 --heads=12 --kv_heads=2 --intermediate=8960 \
        --vocab=151936 --roofline=1x1x128x512,8x1x128x512,64x1x128x512 \
        --bandwidth_bytes=4294967296
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import dataclasses
import os
import tempfile

import jax
import numpy as np
from absl import app, flags
from flax import nnx

from isojax import storage
from isojax.bench import (long_outputs, lora_sampling, ours, report, rl_step, roofline,
                          sampling, skew, slots)
from isojax.bench import train_step, trl_step
from isojax.bench import tunix as tunix_lib
from isojax.bench.options import REAL_MODEL_SECTIONS, SECTIONS, Options, check_options
from isojax.bench.timing import parse_levels
from isojax.models import hf_checkpoint


def run(o: Options) -> dict:
  """Every measurement; the JSON-ready figures."""
  rng = np.random.default_rng(o.seed)
  wanted = set(o.sections)
  if "sampling" in wanted:   # this interpreter's Tunix, for the sampler comparison
    print(tunix_lib.tunix_status())
  real = dict(
      trl=lambda: trl_step.compare(o.trl_config, steps=o.trl_steps, rounds=o.trl_rounds,
                                   tunix_python=o.tunix_python),
      slots=lambda: slots.compare(o.slots_config, parse_levels(o.slots_levels), o.slots_n,
                                  repeats=o.repeats, seed=o.seed))
  if wanted <= set(REAL_MODEL_SECTIONS):   # real models of their own: no random checkpoint
    return dict(options=dataclasses.asdict(o), jax=jax.__version__,
                backend=jax.default_backend(), cpu_count=os.cpu_count(),
                **{name: real[name]() if name in wanted else None for name in SECTIONS})
  hf = hf_model = tunix = None
  with tempfile.TemporaryDirectory(prefix="isojax_bench_") as path:
    ours.write_checkpoint(path, o)
    model = nnx.split(hf_checkpoint.load_model(path))
    lora_models = (lora_sampling.adapted_and_merged(path, o.lora_rank) if "lora" in wanted
                   else None)
    if "sampling" in wanted:   # the one section that measures Hugging Face (and Tunix)
      from isojax.bench import hf  # pylint: disable=g-import-not-at-top
      hf_model = hf.load(path)
      tunix = tunix_lib.load(path) if tunix_lib.tunix_available() else None
  counts = ours.param_counts(model)
  info = dict(options=dataclasses.asdict(o), params=counts, jax=jax.__version__,
              backend=jax.default_backend(), cpu_count=os.cpu_count(),
              torch=None, torch_threads=None, torch_device=None, same_weights=None,
              tunix_same_weights=tunix_lib.tunix_same_weights(model, tunix, o))
  if hf is not None:
    info.update(torch=hf.torch.__version__, torch_threads=hf.torch.get_num_threads(),
                torch_device=hf.device(),
                same_weights=hf.same_weights(model, hf_model, o,
                                             np.random.default_rng(o.seed + 2)))
  # Every section in its fixed order (each draws its prompts from the one generator);
  # the ones not asked for are null.
  sections = dict(
      sampling=lambda: [sampling.bench_sampling(model, hf_model, w, o, rng, tunix)
                        for w in o.workloads],
      sharing=lambda: sampling.bench_sharing(model, o, rng),
      skew=lambda: skew.bench_skew(model, o, rng),
      long=lambda: long_outputs.bench_long(model, o, rng),
      update=lambda: train_step.bench_update(model, counts, o, rng),
      rl_step=lambda: rl_step.breakdown(rl_step.default_config(o.rl_steps))
      if o.rl_steps else None,
      roofline=lambda: [roofline.bench_decode_roofline(model, counts, w, o, rng, tied=False)
                        for w in o.roofline],
      lora=lambda: lora_sampling.bench_lora_sampling(lora_models, o, rng), **real)
  return dict(info, **{name: fn() if name in wanted else None
                       for name, fn in sections.items()})


def options_from_flags() -> Options:
  kw = {f.name: flags.FLAGS[f.name].value for f in dataclasses.fields(Options)}
  for name in ("share_n", "skew_n", "slots_n"):
    if not all(x.isdigit() and int(x) > 0 for x in kw[name]):
      raise app.UsageError(f"--{name}={','.join(kw[name])}: expected positive integers")
  return Options(**dict(kw, share_n=tuple(map(int, kw["share_n"])),
                        skew_n=tuple(map(int, kw["skew_n"])),
                        slots_n=tuple(map(int, kw["slots_n"])),
                        slots_levels=tuple(kw["slots_levels"]),
                        workloads=tuple(kw["workloads"]), roofline=tuple(kw["roofline"]),
                        sections=tuple(kw["sections"])))


_HELP = {"": "Model size (the Qwen2Config field of that meaning).",
         "workloads": "Sampling workloads GxNxPxT: prompts x rollouts per prompt x prompt "
                      "tokens x new tokens.",
         "share": "Shared prompt cache: values of n, total rollouts, P and T.",
         "skew": "Length skew: rows, rollouts per prompt (a list; G = rows / n), P, T, "
                 "fraction of prompts run to T, candidate prompts, continuous-batching "
                 "slots, the fewest they halve down to (0: no halving).",
         "long": "Long outputs: workload GxNxPxT and the decode_block of the blocked run.",
         "update_profile": "A directory: trace one update step there with jax.profiler "
                           "and report its seconds by kind (matmul, data move, other) and "
                           "the matmul kernels' own FLOP/s (empty: no trace).",
         "update": "Update step: sequences, tokens per sequence, prompt tokens of them.",
         "matmul": "Side of the float32 matmul that measures the FLOP/s peak.",
         "rl": "Steps of configs/hard.py whose phases are timed (the first is left out; "
               "0: skip).",
         "roofline": "Decode roofline: workloads GxNxPxT (T >= 2) and the dtype of weights, "
                     "activations and cache (float32 | bfloat16).",
         "bandwidth": "Bytes of the float32 array whose jitted x * 2 measures the copy "
                      "bandwidth.",
         "lora": "LoRA sampling: the adapters' rank and a workload GxNxPxT (the adapted "
                 "model against its merged weights).",
         "trl": "TRL comparison: the config file, RL steps per child process, rounds.",
         "tunix": "TRL comparison: the python of an environment with google-tunix, which "
                  "runs Tunix's GRPO learner as a third side (empty: no Tunix side).",
         "slots": "Lockstep against continuous batching: the run config (FILE[:ARG]) whose "
                  "model, problems and sampler are timed, the decode_slots:decode_slots_min "
                  "levels (0:0: lockstep), and the n of the timed step calls.",
         "sections": f"Sections to run, of {','.join(SECTIONS)} (trl and slots only when "
                     "named).",
         "repeats": "Timed rounds per comparison (each side called once per round; "
                    "medians are reported).", "seed": "Seed."}


def _define_flags() -> None:
  """The binary's flags, defined only when it runs (tests import the functions beside
  other launch modules that define --out too)."""
  for f in dataclasses.fields(Options):
    help_ = next((h for k, h in _HELP.items() if k and f.name.startswith(k)), _HELP[""])
    if isinstance(f.default, tuple):
      flags.DEFINE_list(f.name, [str(x) for x in f.default], help_)
    elif isinstance(f.default, float):
      flags.DEFINE_float(f.name, f.default, help_)
    elif isinstance(f.default, str):
      flags.DEFINE_string(f.name, f.default, help_)
    else:
      flags.DEFINE_integer(f.name, f.default, help_)
  flags.DEFINE_string("out", None, "Where to write the figures as JSON.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  options = options_from_flags()
  try:
    check_options(options)   # fail before building anything
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  results = run(options)
  print(report.format_table(results))
  out = flags.FLAGS.out
  if out:
    storage.write_json(out, results)
    print(f"wrote {out}")



if __name__ == "__main__":
  _define_flags()
  app.run(main)
