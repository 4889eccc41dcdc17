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
from absl import app, flags, logging
from ml_collections import config_flags

from isojax import command_line
from isojax.sweeps import profile_flags, profiling

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/hard.py", "Run config whose base model and sampling settings are "
    "profiled (file.py[:preset]).", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Directory of the split files, local or gs:// "
                           "(default: the config's task.splits_dir).")
_OPTIONS = profile_flags.define_option_flags()
flags.adopt_module_key_flags(profile_flags)  # list them in --help


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  config = _CONFIG.value
  options = _OPTIONS(_OUT.value or config.task.splits_dir)
  try:
    summaries = profiling.profile(config, options)
  except profiling.ProfileError as e:
    raise SystemExit(f"launch.profile: error: {e}") from None
  print(profiling.format_table(summaries, options.num_samples))
  print()
  print(profiling.pool_table(options.out_dir))


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.parse_flags)
