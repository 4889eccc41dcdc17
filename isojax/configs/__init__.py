"""The config files isojax ships, and how a config file named on a command line is found.

Every binary with a `--config` flag (and every sweep config's `base_config`) accepts
`path.py[:arg]`. A path that exists (absolute, or relative to the current directory)
is used as it is; otherwise `configs/<name>.py` names the file shipped here, so
`--config=configs/hard.py` works from any directory with the package installed.
"""

from __future__ import annotations

import os
from typing import Sequence

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_PREFIX = "configs" + os.sep


def shipped(name: str) -> str:
  """The path of a shipped config file, e.g. shipped("from_json.py")."""
  return os.path.join(PACKAGE_DIR, name)


def find(path: str) -> str:
  """`path` itself if it exists, else the shipped file it names ("configs/hard.py").

  Raises FileNotFoundError naming the places looked in.
  """
  if os.path.isfile(path):
    return path
  candidates = [os.path.abspath(path)]
  normalized = os.path.normpath(path)
  if not os.path.isabs(path) and normalized.startswith(_PREFIX):
    candidate = shipped(normalized[len(_PREFIX):])
    if os.path.isfile(candidate):
      return candidate
    candidates.append(candidate)
  raise FileNotFoundError(f"config file {path!r} does not exist (looked in "
                          f"{', '.join(candidates)})")


def find_spec(spec: str) -> str:
  """`path.py[:arg]` with the path found by `find`, the argument kept."""
  path, sep, arg = spec.partition(":")
  return find(path) + sep + arg


def resolve_argv(argv: Sequence[str], flag: str = "config") -> list[str]:
  """`argv` with the file of each `--<flag>=path[:arg]` found by `find`; a file that
  exists nowhere is left for the flag parser to report."""
  out = []
  for arg in argv:
    prefix = f"--{flag}="
    if arg.startswith(prefix):
      try:
        arg = prefix + find_spec(arg[len(prefix):])
      except FileNotFoundError:
        pass
    out.append(arg)
  return out
