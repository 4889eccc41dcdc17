r"""Runs one isojax RL job.

  python -m isojax.main --config=configs/hard.py --workdir=/tmp/isojax/hard
  python -m isojax.main --config=configs/easy.py:paper --workdir=... \
      --config.rollouts_per_problem=16

Rerunning the same command on the same workdir resumes from the last checkpoint, with
the run's settings: a changed field is refused, naming it, unless `--allow_changed`
names it (then it is recorded in config_history.jsonl). `--resume_step` goes back to an
older checkpoint, such as the one a collapse keeps:

  python -m isojax.main --config=configs/hard.py --workdir=/tmp/isojax/hard \
      --resume_step=20 --allow_changed=optim.learning_rate --config.optim.learning_rate=1e-5

A SIGTERM (a preemption) saves the step the run reached and exits 0; a second run on a
workdir that a live run holds, a refused resume, a full disk and a run the guard stops
exit 1 with one line saying why.
Multi-host runs initialise `jax.distributed` from the ISOJAX_* environment variables
that the generated cluster scripts set (see `isojax.distributed`).
"""

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import jax
from absl import app, flags, logging
from ml_collections import config_flags

from isojax import command_line, distributed, run_dir, storage
from isojax.config import config_lib
from isojax.models import checkpoint_files
from isojax.rl import guard
from isojax.run import checkpointing, preemption, resume_check, train, workdir_lock
from isojax.tasks import data_files

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/hard.py", "Config file, optionally with a preset: file.py:preset.",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/isojax/run", "Run directory.")
_FORCE_UNLOCK = flags.DEFINE_bool(
    "force_unlock", False, "Take the workdir from a run that holds it but is gone (its "
    "pid no longer runs on this host, or, on another host, its heartbeat is stale: a "
    "lost machine's lock on a shared filesystem or lease on an object store). A live "
    "holder is refused.")
_ALLOW_CHANGED = flags.DEFINE_list(
    "allow_changed", [], "Config fields (or sections) a resume may change from the run's "
    "settings, e.g. optim.learning_rate; each change is recorded in config_history.jsonl "
    "and as a settings_changed event.")
_RESUME_STEP = flags.DEFINE_integer(
    "resume_step", None, "Resume from this checkpoint step instead of the newest; the newer "
    "checkpoints are moved to checkpoints/superseded/.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  not_a_dir = storage.not_a_directory(_WORKDIR.value)
  if not_a_dir:
    raise SystemExit(f"isojax.main: error: --workdir={_WORKDIR.value}: {not_a_dir} is a "
                     "file; expected a directory")
  logging.set_verbosity(max(logging.get_verbosity(), logging.INFO))  # --verbosity=1 kept
  if distributed.initialize():  # before anything touches a device
    logging.info("jax.distributed initialised: process %d of %d",
                 jax.process_index(), jax.process_count())
  settings = config_lib.as_settings(_CONFIG.value)  # the ConfigDict ends here
  try:
    final = train.run(settings, _WORKDIR.value, force_unlock=_FORCE_UNLOCK.value,
                      allow_changed=_ALLOW_CHANGED.value, resume_step=_RESUME_STEP.value)
  except preemption.Preempted as e:
    logging.warning("%s", e)  # exit status 0: a scheduler requeues, a rerun resumes
    return
  except (workdir_lock.WorkdirLocked, resume_check.SettingsChanged, storage.NoSpace) as e:
    raise SystemExit(f"isojax.main: error: {e}") from None
  except (data_files.DataFileError, run_dir.RunFormatError,
          checkpointing.NoRestorableCheckpoint, checkpoint_files.CheckpointFileError) as e:
    # Bad input files: the message names the file and line; the traceback is noise
    # unless asked for (--verbosity=1).
    logging.debug("the error's traceback", exc_info=True)
    raise SystemExit(f"isojax.main: error: {e}") from None
  except guard.RunStopped as e:
    raise SystemExit(f"isojax.main: stopped: {e}") from None
  logging.info("final evaluation: %s", final)


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.parse_flags)
