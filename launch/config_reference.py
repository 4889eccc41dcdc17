r"""Rewrites docs/configs.md's field reference from the typed settings.

    python -m launch.config_reference

Every field's default and meaning live beside the field (`isojax.validation.field`);
this regenerates the tables between the doc's markers (`isojax.config.config_reference`).
"""

from __future__ import annotations

import os

from absl import app

from isojax.config import config_reference

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                   "configs.md")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  changed = config_reference.update(DOC)
  print(f"{DOC}: {'rewritten' if changed else 'already current'}")


if __name__ == "__main__":
  app.run(main)
