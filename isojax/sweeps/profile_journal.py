"""What a difficulty profile has measured so far, so a stopped one resumes.

Profiling a real model's pool is hours of sampling on a CPU (SmolLM2's 4,096 problems
x 16 samples), and a preemption or a killed job would otherwise lose all of it: the
splits are written only once every problem is measured. The journal keeps each chunk
of `evaluation.correct_counts` as it finishes, in DIR/profile_partial.json, under the
name of its pass (the training pool's avg@k, the validation pool's, each extra round of
pass@hard_samples). A rerun with the same settings takes those chunks as they are and
samples only the rest; each chunk's key depends on its pass and first problem only, so
the resumed profile equals an uninterrupted one. Different settings (another model,
sampling, pool, chunk or sampler call size) start afresh. The file is removed once the
splits are written.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from absl import logging

from isojax import storage
from isojax.run import evaluation

PARTIAL_FILE = "profile_partial.json"


class Journal:
  """The chunks measured under `key` (a JSON-ready dict of everything that determines
  them), read from and written to `out_dir`."""

  def __init__(self, out_dir: str, key: dict[str, Any]):
    self.path = storage.path(out_dir) / PARTIAL_FILE
    # As it reads back (tuples become lists), so it compares equal to a saved one.
    self.key = json.loads(json.dumps(key, default=storage.json_default))
    self.passes: dict[str, dict[str, Any]] = {}
    try:
      saved = storage.read_json(self.path)
    except FileNotFoundError:
      return
    except ValueError as e:  # a torn or foreign file: measure again
      logging.warning("%s; measuring every chunk again", e)
      return
    if isinstance(saved, dict) and saved.get("key") == self.key:
      self.passes = saved.get("passes", {})
      logging.info("resuming the profile from %s: %d chunk(s) measured", self.path,
                   sum(len(chunks) for chunks in self.passes.values()))
    else:
      logging.info("%s holds another profile's chunks; measuring every chunk", self.path)

  def done(self, name: str) -> dict[int, evaluation.SampleCounts]:
    """The chunks of pass `name` measured so far, by their first problem's index."""
    return {int(start): evaluation.SampleCounts(
                np.asarray(c["correct"], np.int64), np.asarray(c["lengths"], np.int64),
                np.asarray(c["truncated"], bool))
            for start, c in self.passes.get(name, {}).items()}

  def recorder(self, name: str):
    """An `on_chunk` for `correct_counts` that records pass `name`'s chunks."""
    def record(start: int, counts: evaluation.SampleCounts) -> None:
      self.passes.setdefault(name, {})[str(start)] = dict(
          correct=counts.correct_G.tolist(), lengths=counts.lengths_GN.tolist(),
          truncated=counts.truncated_GN.tolist())
      storage.write_json(self.path, dict(key=self.key, passes=self.passes), indent=None)
    return record

  def remove(self) -> None:
    if self.path.exists():
      self.path.unlink()
