r"""Copies a study's or sweep's records without its checkpoints: to keep them (in a
repository, beside the tables they produced) or to resume on another machine.

  python -m launch.records --from=/tmp/isojax_reproduce/smollm2_study \
      --to=docs/results/records/smollm2_study
  python -m launch.records --from=docs/results/records/smollm2_study \
      --to=/tmp/isojax_reproduce/smollm2_study

Carried: the study's and sweeps' files (the splits, the profile's journal, manifests,
analyses, findings) and every finished run's config, metrics and plan; left out:
checkpoints, the XLA cache, logs, plots and unfinished runs, which start afresh where
the records are restored (`isojax.sweeps.records`). Relaunching the same `launch.study`,
`launch.sweep` or `launch.reproduce` command on the restored directory skips the
finished runs and resumes the profile from its journal.
"""

from __future__ import annotations

from absl import app, flags

from isojax.sweeps import records

_FROM = flags.DEFINE_string("from", None, "The study or sweep directory to copy.",
                            required=True)
_TO = flags.DEFINE_string("to", None, "Where to copy its records (files there are "
                          "replaced).", required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  try:
    copied = records.copy(_FROM.value, _TO.value)
  except records.RecordsError as e:
    raise SystemExit(f"launch.records: {e}") from None
  print(f"{len(copied.files)} files, {len(copied.finished_runs)} finished runs copied to "
        f"{_TO.value}; {len(copied.unfinished_runs)} unfinished runs left out"
        + (f": {', '.join(copied.unfinished_runs)}" if copied.unfinished_runs else ""))


if __name__ == "__main__":
  app.run(main)
