r"""Checks that the current tree computes what a base commit computed, bit for bit.

    python -m launch.check_identical                       # base: merge-base with main
    python -m launch.check_identical --base=HEAD~3 --runs=hard-micro,ppo-micro
    python -m launch.check_identical --base=v0.1 --out=/data/isojax_identical

Runs every shipped run config's `micro` preset and configs/hard.py's default preset at
20 steps, first at --base (checked out into a temporary git worktree; its runs are kept
under --out and reused by later checks against the same commit), then from this
checkout, uncommitted changes included; and compares each pair of run directories:
metrics.jsonl without its wall-clock fields, config.json, the files' names, and every
array of every checkpoint (`isojax.tools.identical_runs`, `isojax.tools.run_compare`). Prints one
line per run (identical, or the first step and field, or the first array path and its
largest difference, that changed) and exits with status 1 when any run differs or fails.
Both sides must run on the same machine, pinned to the same cores: XLA:CPU's float
results depend on both (two runs of one commit, one on both cores and one under
`taskset -c 0`, differed in the last bits of two configs' checkpoints). Give a fresh
--out when the base's cached runs were made otherwise.
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import functools
import os
import time

from absl import app, flags, logging

from isojax.tools import identical_runs

_BASE = flags.DEFINE_string("base", None, "The commit whose runs are the reference "
                            "(default: the merge-base of HEAD and main).")
_OUT = flags.DEFINE_string("out", "/tmp/isojax/identical", "Directory for the runs; the "
                           "base commit's are kept here and reused.")
_RUNS = flags.DEFINE_list("runs", [], "Runs to compare (default: all), e.g. hard-micro.")

# The checkout holding this package: the tree whose numbers are checked.
TREE = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(identical_runs.__file__))))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax's INFO lines for every restore
  base = _BASE.value or identical_runs.merge_base(TREE, "main")
  start = time.perf_counter()
  results = identical_runs.check(TREE, base, _OUT.value, _RUNS.value,
                                 log=functools.partial(print, flush=True))
  same = sum(r.identical for r in results)
  print(f"{same} of {len(results)} runs identical to {base} "
        f"({time.perf_counter() - start:.0f} s)")
  for result in results:
    print(identical_runs.report_line(result))
  if same < len(results):
    raise SystemExit(1)


if __name__ == "__main__":
  app.run(main)
