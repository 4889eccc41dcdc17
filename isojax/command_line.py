"""The command-line edge of every binary with a `--config` flag.

`parse_flags` is absl's flag parsing with two things first: a `--config` file that does
not exist where it is named is looked up among the shipped ones (`isojax.configs.find`),
and a `--config.<field>=...` override of a field the schema lacks fails with the closest
known field (`config_lib.check_overrides`; ml_collections alone raises a bare KeyError).
It lives here, above both the config files and the schema, so that `config_lib` imports
neither the config files nor absl's app.
"""

from __future__ import annotations

import sys

from absl import app

from isojax import configs
from isojax.config import config_lib


def parse_flags(argv: list[str]) -> list[str]:
  """`app.run(main, flags_parser=command_line.parse_flags)` of every binary with a
  --config flag, so a mistyped field fails with a suggestion."""
  argv = configs.resolve_argv(argv)
  try:
    config_lib.check_overrides(argv)
  except ValueError as e:
    sys.stderr.write(f"FATAL Flags parsing error: {e}\n")
    sys.exit(1)
  return app.parse_flags_with_usage(argv)
