r"""Profile the base model's difficulty and write the paper's splits.

    python -m launch.profile --config=configs/hard.py
    python -m launch.profile --config=configs/hard.py --num_samples=16 --pool_size=4096 \
        --out=~/.cache/isojax/splits
    python -m isojax.main --config=configs/hard.py --config.task.split=hard   # use a split

Samples --num_samples rollouts (avg@16) for each of --pool_size candidate training and
--val_pool_size candidate validation problems (additions with --min_digits to
--max_digits digits) with the base model of --config, loaded as the RL loop loads it,
at the config's sampling settings; problems with avg@16 = 0 get --hard_samples more
(pass@128) for the extremely hard split. It writes one file per split
(`<out>/<split>.json`: easy, hard, extremely_hard, very_easy, mix_hard_easy,
mix_hard_easy_veryeasy; bands in `isojax.tasks.difficulty`) and the per-problem pass rates
(`<out>/profile.json`), then prints the split sizes and mean pass rates.

Rerunning with the same model and settings reuses the files (--force redoes them). A
split that cannot be filled to --num_train / --num_val is written with what exists and
a warning; an empty split is an error naming it.
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import dataclasses
import functools
from typing import Callable

from absl import app, flags, logging
from ml_collections import config_flags

from isojax import command_line
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
  """Defines the profiling flags and returns `options_from_flags(out_dir)`.

  Called once by this binary and once by `launch.study`, so both expose the same knobs
  with the same defaults.
  """
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


def main(argv, *, options_from_flags: Callable[[str], profiling.Options]):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  config = flags.FLAGS.config
  options = options_from_flags(flags.FLAGS.out or config.task.splits_dir)
  try:
    summaries = profiling.profile(config, options)
  except profiling.ProfileError as e:
    raise SystemExit(f"launch.profile: error: {e}") from None
  print(profiling.format_table(summaries, options.num_samples))
  print()
  print(profiling.pool_table(options.out_dir))


if __name__ == "__main__":
  # Flags are defined only when this runs as the binary: `launch.study` imports
  # `define_option_flags` beside its own --out.
  config_flags.DEFINE_config_file(
      "config", "configs/hard.py", "Run config whose base model and sampling settings are "
      "profiled (file.py[:preset]).", lock_config=True)
  flags.DEFINE_string("out", None, "Directory of the split files, local or gs:// "
                      "(default: the config's task.splits_dir).")
  app.run(functools.partial(main, options_from_flags=define_option_flags()),
          flags_parser=command_line.parse_flags)
