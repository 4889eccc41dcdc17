"""A stand-in for `isojax.main` in the local pool's tests: a script the runner starts
in its place (`runner.main_command` patched), as `python SCRIPT PLAN WORKDIR RECORD`,
so a test pins scheduling and files in seconds."""

import sys

from isojax.sweeps import runner as sweep_runner


def use(tmp_path, monkeypatch, source: str):
  """Runs `source` for every run the pool starts; the path of the RECORD file its
  runs may append to."""
  script = tmp_path / "fake_main.py"
  script.write_text(source)
  record = tmp_path / "record.txt"
  monkeypatch.setattr(sweep_runner, "main_command", lambda plan, workdir, **_: [
      sys.executable, str(script), plan, workdir, str(record)])
  return record
