"""isojax.compare (behind launch.compare): time to reach the baseline's peak."""

import pytest

from isojax import compare


def _lines(values, per_step=8):
  return [dict(step=s, rollouts=s * per_step, tokens=s * 40, wall_s=s * 0.5,
               **({"val/avg@4": v} if v is not None else {})) for s, v in enumerate(values)]


def test_candidate_reaching_the_peak_earlier():
  base = _lines([0.1, 0.2, None, 0.35, 0.3])
  cand = _lines([0.1, 0.36, 0.2], per_step=32)
  out = compare.compare(base, cand, "val/avg@4")
  assert out["target"] == 0.35
  assert out["baseline"] == dict(step=3, rollouts=24, tokens=120, wall_s=1.5)
  assert out["candidate"] == dict(step=1, rollouts=32, tokens=40, wall_s=0.5)
  assert out["candidate_best"] == 0.36


def test_candidate_that_never_reaches_it():
  out = compare.compare(_lines([0.1, 0.5]), _lines([0.1, 0.4]), "val/avg@4")
  assert out["candidate"] is None and out["candidate_best"] == 0.4


def test_baseline_without_the_metric():
  with pytest.raises(ValueError, match="val/avg@4"):
    compare.compare(_lines([None, None]), _lines([0.1]), "val/avg@4")
