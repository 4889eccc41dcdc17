r"""The findings table of a study directory, from its sweeps' experiment.json files.

    python -m launch.findings --study=/tmp/isojax/study

`launch.study` writes DIR/findings.md at its end; this rebuilds it (after a sweep
was rerun or added by hand with `launch.sweep --out=DIR/<name>`) and prints it.
"""

from __future__ import annotations

from absl import app, flags

from isojax.planner import findings

_STUDY = flags.DEFINE_string("study", None, "The study directory.", required=True)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    _, text = findings.write_study_findings(_STUDY.value)
  except (FileNotFoundError, ValueError) as e:
    raise SystemExit(f"launch.findings: error: {e}") from None
  print(text)


if __name__ == "__main__":
  app.run(main)
