"""The config files isojax ships, and how a config file named on a command line is found.

The files live here, in `configs/` at the top of the repository, where a reader looks
for them; `isojax/configs` is a symbolic link to this folder, so the same files are the
package `isojax.configs` (`from isojax.configs import hard`) and a wheel copies them in
as `isojax/configs/`. A link rather than setup.py's `package_dir` mapping: the mapping
resolves `isojax.configs` through the installed copy's finder, so a run from another
checkout (or from a source tree on PYTHONPATH) would import the installed checkout's
configs, or none, instead of the files beside it. With the link nothing is duplicated:
the file a user edits is the file that runs.

Every binary with a `--config` flag (and every sweep config's `base_config`) accepts
`path.py[:arg]`. A path that exists (absolute, or relative to the current directory)
is used as it is; otherwise `configs/<name>.py` names the file shipped here, so
`--config=configs/hard.py` works from any directory with the package installed.
"""

from __future__ import annotations

import os
from typing import Sequence

import ml_collections
from ml_collections.config_flags import config_flags

# The real folder (configs/ in a checkout, not the isojax/configs link): the paths
# found and named in errors are the files a user edits.
PACKAGE_DIR = os.path.dirname(os.path.realpath(__file__))
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


def load(spec: str) -> ml_collections.ConfigDict:
  """`get_config(arg)` of `path.py[:arg]` (the path found by `find`), unlocked, as a
  `--config` flag would load it. Raises FileNotFoundError as `find` does."""
  parser = config_flags.ConfigFileFlagParser(name="config", lock_config=False)
  return parser.parse(find_spec(spec))


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
