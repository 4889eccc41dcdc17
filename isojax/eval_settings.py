"""The evaluation settings (`config.eval`) and the schedule they give: JAX-free.

`train.run` evaluates the validation set at `EvalSettings.steps(num_steps)`, a pure
function of the config, so a resumed run evaluates where the uninterrupted one would;
the sweeps (`isojax.sweeps.plan`) pick their runs' schedules from `SCHEDULES`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from isojax import validation

F = validation.field

# "linear": every `every` steps; "log": `count` log-spaced steps (dense early, where the
# metric moves fastest).
SCHEDULES = ("linear", "log")


@dataclasses.dataclass(frozen=True)
class EvalSettings(validation.Section):
  """`config.eval`: when the validation set is evaluated, with how many samples."""
  schedule: str = F("linear", "`linear` (every `every` steps) or `log` (`count` log-spaced "
                    "steps, dense early where the metric moves fastest); always step 0 "
                    "and M")
  every: int = F(10, "linear: steps between evaluations")
  count: int = F(16, "log: evaluations after step 0, at most")
  k: int = F(4, "k of avg@k / best@k / worst@k")
  num_samples: int = F(8, "N >= k samples per validation problem")
  chunk_problems: int = F(256, "validation problems per sampler call")
  train_problems: int = F(128, "training problems in the pass@1 histogram; 0 disables")

  def __post_init__(self):
    validation.choice("eval.schedule", self.schedule, SCHEDULES)
    for field in ("every", "count", "k", "num_samples", "chunk_problems"):
      validation.positive_int(f"eval.{field}", getattr(self, field))
    validation.non_negative_int("eval.train_problems", self.train_problems,
                                "0: no pass@1 histogram")
    if self.num_samples < self.k:
      raise ValueError(f"eval.num_samples={self.num_samples} must be >= eval.k={self.k}")


  def steps(self, num_steps: int) -> frozenset[int]:
    """The steps (0..num_steps) after which `train.run` evaluates.

    Always step 0 (the base model) and num_steps (the final policy), and between them
      linear: every multiple of `every`;
      log:    the distinct values of round(geomspace(1, num_steps, count)), so a run
              with fewer than `count` steps, or a large `count`, gets fewer.
    With count=1 the log schedule evaluates at steps 0 and num_steps only.
    """
    if self.schedule == "linear":
      between = range(0, num_steps + 1, self.every)
    else:
      between = (np.rint(np.geomspace(1, num_steps, self.count)).astype(int).tolist()
                 if self.count > 1 else [])
    return frozenset({0, num_steps, *between})
