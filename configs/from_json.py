r"""Loads a config written as JSON (a planner prescription, or a run's config.json).

  python -m isojax.main --config=configs/from_json.py:/path/to/plan.json --workdir=...

Fields absent from the file keep their `base_config()` defaults; unknown fields are
rejected by `config_lib.resolve` before anything runs.
"""

from isojax.config import config_lib


def get_config(path=None):
  if not path:
    raise ValueError("configs/from_json.py needs a path: --config=configs/from_json.py:FILE")
  return config_lib.config_from_json(path)
