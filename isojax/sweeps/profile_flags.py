"""The profiling knobs (`profiling.Options`) as absl flags, for every binary that profiles.

`launch.profile` and `launch.study` both call `define_option_flags`, so they expose the
same knobs with the same defaults and help, and neither binary imports the other.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from absl import flags

from isojax.sweeps import profiling

# Help of each profiling knob; the defaults are those of `profiling.Options`.
_HELP = dict(
    num_samples="k of avg@k, the difficulty measure.",
    hard_samples="Further samples for problems with avg@k = 0; those with none correct "
                 "form the extremely hard split.",
    pool_size="Candidate training problems.",
    val_pool_size="Candidate validation problems.",
    min_digits="Fewest operand digits in the pool.",
    max_digits="Most operand digits in the pool.",
    num_train="Training problems per split.",
    num_val="Held-out validation problems per split.",
    seed="Seed of the pool and sampling.",
    chunk_rollouts="Rollouts per sampler call.",
    splits="Splits to write.",
    force="Recompute even if the split files are up to date.",
)


def define_option_flags() -> Callable[[str], profiling.Options]:
  """Defines the profiling flags and returns `options_from_flags(out_dir)`. Call it once
  per process; `flags.adopt_module_key_flags(profile_flags)` lists them in --help."""
  defaults = profiling.Options(out_dir="")
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, tuple: flags.DEFINE_list}
  defined = {}
  for field in dataclasses.fields(profiling.Options):
    if field.name in _HELP:
      default = getattr(defaults, field.name)
      defined[field.name] = define[type(default)](
          field.name, list(default) if isinstance(default, tuple) else default,
          f"Profiling: {_HELP[field.name]}")

  def options_from_flags(out_dir: str) -> profiling.Options:
    values = {k: v.value for k, v in defined.items()}
    return profiling.Options(out_dir=out_dir, **dict(values, splits=tuple(values["splits"])))

  return options_from_flags
