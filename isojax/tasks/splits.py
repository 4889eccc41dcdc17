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

from typing import Any, Sequence

from etils import epath

import numpy as np

from isojax import storage
from isojax.tasks.difficulty import BANDS
from isojax.tasks.problem import Problem

SPLIT_KEYS = ("train", "val")
PROFILE_FILE = "profile.json"   # per-problem pass rates of the pool, beside the splits


def split_path(splits_dir: storage.PathLike, name: str) -> epath.Path:
  return storage.path(splits_dir) / f"{name}.json"


def save_split(splits_dir: storage.PathLike, name: str, train: Sequence[Problem],
               val: Sequence[Problem], pass_rates: dict[str, float],
               meta: dict[str, Any]) -> epath.Path:
  """Writes a split atomically; `pass_rates` maps prompt -> measured base pass rate."""
  row = lambda p: dict(prompt=p.prompt, answer=p.answer, difficulty=p.difficulty,
                       meta=p.meta, pass_rate=pass_rates.get(p.prompt))
  payload = dict(name=name, meta=meta, train=[row(p) for p in train],
                 val=[row(p) for p in val])
  return storage.write_json(split_path(splits_dir, name), payload)


def read_split(splits_dir: storage.PathLike, name: str) -> dict[str, Any]:
  """The split file's JSON; a missing file says how to make it."""
  path = split_path(splits_dir, name)
  if not path.is_file():
    raise FileNotFoundError(
        f"task.split={name!r}: {path} does not exist; create it with "
        "`python -m launch.profile` or set task.split='' to generate problems")
  return storage.read_json(path)


def load_split(splits_dir: storage.PathLike, name: str
               ) -> tuple[list[Problem], list[Problem]]:
  payload = read_split(splits_dir, name)
  try:
    return tuple([Problem(prompt=r["prompt"], answer=r["answer"],
                          difficulty=int(r["difficulty"]), meta=r.get("meta", ""))
                  for r in payload[key]]
                 for key in SPLIT_KEYS)
  except (KeyError, TypeError) as e:
    raise ValueError(f"{split_path(splits_dir, name)}: malformed split file ({e!r}); "
                     f"expected keys {SPLIT_KEYS} of problem lists") from e


def training_pass_rates(splits_dir: storage.PathLike, name: str
                        ) -> tuple[dict[str, float], int]:
  """The split's training problems' measured rates (prompt -> rate) and the samples each
  rate is of (avg@k's k; pass@k's for the extremely hard split)."""
  payload = read_split(splits_dir, name)
  meta = payload.get("meta", {})
  samples = meta.get("hard_samples") or meta.get("num_samples")
  if not samples:
    raise ValueError(f"{split_path(splits_dir, name)}: its meta names no num_samples, so its "
                     "pass rates cannot be read as counts")
  rates = {r["prompt"]: float(r["pass_rate"]) for r in payload["train"]
           if r.get("pass_rate") is not None}
  return rates, int(samples)


def read_split_meta(splits_dir: storage.PathLike, name: str) -> dict[str, Any]:
  payload = read_split(splits_dir, name)
  return dict(payload.get("meta", {}), num_train=len(payload["train"]),
              num_val=len(payload["val"]))


def pool_table(splits_dir: storage.PathLike) -> str:
  """Per value of the problems' difficulty (arithmetic: operand digits; chain_sum: terms
  x digits), then all together: problems, mean avg@k, the fraction in each of the
  paper's classes and, where the profile recorded them, the samples' lengths in tokens
  (median, 90th percentile, longest) and the fraction cut at the token cap; from the
  profile beside the splits."""
  path = storage.path(splits_dir) / PROFILE_FILE
  if not path.is_file():
    return f"{path}: missing (rerun with --force to measure the pool again)"
  data = storage.read_json(path)
  k = data["settings"]["num_samples"]
  rows = data["train"] + data["val"]
  has_lengths = all("lengths" in r for r in rows)
  lines = [f"{'difficulty':<12}{'problems':>9}{'avg@' + str(k):>9}" +
           "".join(f"{c:>11}" for c in BANDS) +
           (f"{'tokens p50':>12}{'p90':>6}{'max':>6}{'cut':>7}" if has_lengths else "")]
  groups = [(d, [r for r in rows if r["difficulty"] == d])
            for d in sorted({r["difficulty"] for r in rows})]
  for d, part in groups + ([("all", rows)] if len(groups) > 1 else []):
    rates = np.array([r["correct"] / k for r in part])
    fractions = "".join(f"{np.mean([b.contains(x) for x in rates]):>11.2f}"
                        for b in BANDS.values())
    line = f"{d!s:<12}{len(rates):>9}{rates.mean():>9.3f}{fractions}"
    if has_lengths:
      lengths = np.concatenate([r["lengths"] for r in part])
      cut = sum(r["truncated"] for r in part) / lengths.size
      line += (f"{np.median(lengths):>12.0f}{np.percentile(lengths, 90):>6.0f}"
               f"{lengths.max():>6d}{cut:>7.3f}")
    lines.append(line)
  return "\n".join(lines)
