"""Record-breaking points and run-directory curves."""

import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import pytest

from isojax import run_dir
from isojax.planner import records

_SETTINGS = settings(max_examples=200, deadline=None, database=None)
values = st.lists(st.floats(0, 1, allow_nan=False), min_size=0, max_size=40)


def _brute_records(values_E, width):
  """Loop form of the definition: keep i if its bin beats every earlier bin."""
  kept, best = [], -math.inf
  for i, v in enumerate(values_E):
    level = math.floor(v / width + 1e-9)
    if level > best:
      kept.append(i)
      best = level
  return kept


@_SETTINGS
@given(values_E=values, width=st.sampled_from([0.01, 0.05, 0.1, 0.25]))
def test_record_mask_matches_the_definition(values_E, width):
  mask = records.record_breaking_mask(values_E, width)
  assert list(np.flatnonzero(mask)) == _brute_records(values_E, width)


@_SETTINGS
@given(runs=st.lists(values.filter(bool), min_size=1, max_size=5),
       width=st.sampled_from([0.01, 0.1]))
def test_records_preserve_the_bucketed_frontier(runs, width):
  """Best bin reached by compute t over all runs: same from records or all points."""
  def best_bin_by_time(keep):
    horizon = max(len(r) for r in runs)
    out = np.full(horizon, -np.inf)
    for r, mask in zip(runs, keep):
      bins = np.floor(np.asarray(r) / width + 1e-9)
      for t in range(len(r)):
        if mask[t]:
          out[t:] = np.maximum(out[t:], bins[t])
    return out
  all_points = best_bin_by_time([np.ones(len(r), bool) for r in runs])
  from_records = best_bin_by_time([records.record_breaking_mask(r, width) for r in runs])
  np.testing.assert_array_equal(all_points, from_records)


def test_record_mask_zero_width_keeps_strict_improvements():
  mask = records.record_breaking_mask([0.1, 0.3, 0.3, 0.2, 0.31, 0.31], 0.0)
  assert mask.tolist() == [True, True, False, False, True, False]


def _write_run(root, name, b_p, n, lines):
  path = str(root / name)
  run_dir.write_config(path, {"problems_per_batch": b_p, "rollouts_per_problem": n})
  writer = run_dir.MetricsWriter(path)
  for step, (c, v) in enumerate(lines):
    record = {"step": step, "rollouts": c, "tokens": 8 * c, "wall_s": 0.0}
    if v is not None:
      record["val/avg@4"] = v
    writer.write(record)
  return path


def test_run_curves_pool_by_allocation(tmp_path):
  a = _write_run(tmp_path, "a", 16, 8, [(0, 0.1), (256, 0.3), (128, 0.2)])
  b = _write_run(tmp_path, "b", 16, 8, [(0, 0.12), (128, 0.25), (384, None)])
  c = _write_run(tmp_path, "c", 32, 8, [(0, 0.08), (512, 0.4)])
  curves = [records.run_curve(run_dir.load_run(p), "val/avg@4") for p in (a, b, c)]
  np.testing.assert_array_equal(curves[0].rollouts_E, [0, 128, 256])  # sorted by compute
  np.testing.assert_array_equal(curves[0].values_E, [0.1, 0.2, 0.3])
  pooled = records.pool_curves(curves)
  assert [p.key for p in pooled] == [(16, 8), (32, 8)]
  assert pooled[0].paths == (a, b)
  np.testing.assert_array_equal(pooled[0].rollouts_E, [0, 0, 128, 128, 256])
  np.testing.assert_array_equal(pooled[0].values_E, [0.1, 0.12, 0.2, 0.25, 0.3])
  assert pooled[1].batch_rollouts == 256
  assert records.initial_value(curves) == pytest.approx(np.median([0.1, 0.12, 0.08]))
  assert records.metric_names([run_dir.load_run(a)]) == ["val/avg@4"]


def test_run_curve_rejects_a_config_without_allocation(tmp_path):
  path = _write_run(tmp_path, "bad", 0, 8, [(0, 0.1)])
  with pytest.raises(run_dir.RunFormatError, match="problems_per_batch=0"):
    records.run_curve(run_dir.load_run(path), "val/avg@4")
