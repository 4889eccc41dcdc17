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
mix_hard_easy_veryeasy; bands in `launch.profiling`) and the per-problem pass rates
(`<out>/profile.json`), then prints the split sizes and mean pass rates.

Rerunning with the same model and settings reuses the files (--force redoes them). A
split that cannot be filled to --num_train / --num_val is written with what exists and
a warning; an empty split is an error naming it.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from launch import profiling

_DEFAULTS = profiling.Options(out_dir="")
_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/hard.py", "Run config whose base model and sampling settings are "
    "profiled (file.py[:preset]).", lock_config=True)
_OUT = flags.DEFINE_string("out", None, "Directory of the split files (default: the "
                           "config's task.splits_dir).")
_NUM_SAMPLES = flags.DEFINE_integer("num_samples", _DEFAULTS.num_samples,
                                    "k of avg@k, the difficulty measure.")
_HARD_SAMPLES = flags.DEFINE_integer("hard_samples", _DEFAULTS.hard_samples,
                                     "Further samples for problems with avg@k = 0; those "
                                     "with none correct form the extremely hard split.")
_POOL = flags.DEFINE_integer("pool_size", _DEFAULTS.pool_size, "Candidate training problems.")
_VAL_POOL = flags.DEFINE_integer("val_pool_size", _DEFAULTS.val_pool_size,
                                 "Candidate validation problems.")
_MIN_DIGITS = flags.DEFINE_integer("min_digits", _DEFAULTS.min_digits,
                                   "Fewest operand digits in the pool.")
_MAX_DIGITS = flags.DEFINE_integer("max_digits", _DEFAULTS.max_digits,
                                   "Most operand digits in the pool.")
_NUM_TRAIN = flags.DEFINE_integer("num_train", _DEFAULTS.num_train,
                                  "Training problems per split.")
_NUM_VAL = flags.DEFINE_integer("num_val", _DEFAULTS.num_val,
                                "Held-out validation problems per split.")
_SEED = flags.DEFINE_integer("seed", _DEFAULTS.seed, "Seed of the pool and the sampling.")
_CHUNK = flags.DEFINE_integer("chunk_rollouts", _DEFAULTS.chunk_rollouts,
                              "Rollouts per sampler call (memory vs speed).")
_SPLITS = flags.DEFINE_list("splits", list(profiling.SPLITS), "Splits to write.")
_FORCE = flags.DEFINE_bool("force", False, "Recompute even if the files are up to date.")


def options_from_flags(out_dir: str) -> profiling.Options:
  return profiling.Options(
      out_dir=out_dir, num_samples=_NUM_SAMPLES.value, hard_samples=_HARD_SAMPLES.value,
      pool_size=_POOL.value, val_pool_size=_VAL_POOL.value, min_digits=_MIN_DIGITS.value,
      max_digits=_MAX_DIGITS.value, num_train=_NUM_TRAIN.value, num_val=_NUM_VAL.value,
      seed=_SEED.value, chunk_rollouts=_CHUNK.value, splits=tuple(_SPLITS.value),
      force=_FORCE.value)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  config = _CONFIG.value
  options = options_from_flags(_OUT.value or config.task.splits_dir)
  try:
    summaries = profiling.profile(config, options)
  except profiling.ProfileError as e:
    raise SystemExit(f"launch.profile: error: {e}") from None
  print(profiling.format_table(summaries, options.num_samples))
  print()
  print(profiling.pool_table(options.out_dir))


if __name__ == "__main__":
  app.run(main)
