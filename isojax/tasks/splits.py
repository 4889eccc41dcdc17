"""Named problem splits on disk: what difficulty profiling writes and configs point to.

A split is one JSON file `<splits_dir>/<name>.json`:

  {"name": "hard", "meta": {...how it was made...},
   "train": [{"prompt": ..., "answer": ..., "difficulty": ..., "meta": ...,
              "pass_rate": ...}, ...],
   "val":   [...]}

`pass_rate` is the base model's measured avg@k (or pass@k for the extremely hard
split; `meta` says which). A config selects a split with `task.split=<name>`; with an
empty `task.split` the task generates problems from its difficulty knob instead.
"""

from __future__ import annotations

import json
import os
from typing import Any, Sequence

from isojax.tasks.problem import Problem

SPLIT_KEYS = ("train", "val")


def split_path(splits_dir: str, name: str) -> str:
  return os.path.join(os.path.expanduser(splits_dir), f"{name}.json")


def save_split(splits_dir: str, name: str, train: Sequence[Problem],
               val: Sequence[Problem], pass_rates: dict[str, float],
               meta: dict[str, Any]) -> str:
  """Writes a split atomically; `pass_rates` maps prompt -> measured base pass rate."""
  path = split_path(splits_dir, name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  row = lambda p: dict(prompt=p.prompt, answer=p.answer, difficulty=p.difficulty,
                       meta=p.meta, pass_rate=pass_rates.get(p.prompt))
  payload = dict(name=name, meta=meta, train=[row(p) for p in train],
                 val=[row(p) for p in val])
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(payload, f, indent=1)
  os.replace(tmp, path)
  return path


def load_split(splits_dir: str, name: str
               ) -> tuple[list[Problem], list[Problem]]:
  path = split_path(splits_dir, name)
  if not os.path.isfile(path):
    raise FileNotFoundError(
        f"task.split={name!r}: {path} does not exist; create it with "
        "`python -m launch.profile` or set task.split='' to generate problems")
  try:
    with open(path) as f:
      payload = json.load(f)
    return tuple([Problem(prompt=r["prompt"], answer=r["answer"],
                          difficulty=int(r["difficulty"]), meta=r.get("meta", ""))
                  for r in payload[key]]
                 for key in SPLIT_KEYS)
  except (json.JSONDecodeError, KeyError, TypeError) as e:
    raise ValueError(f"{path}: malformed split file ({e!r}); expected keys "
                     f"{SPLIT_KEYS} of problem lists") from e


def read_split_meta(splits_dir: str, name: str) -> dict[str, Any]:
  with open(split_path(splits_dir, name)) as f:
    payload = json.load(f)
  return dict(payload.get("meta", {}), num_train=len(payload["train"]),
              num_val=len(payload["val"]))
