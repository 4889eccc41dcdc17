"""Prescriptions: the rule, the learning rate, the config, and the errors."""

import json
import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import pytest

from isojax.config import config_lib
from isojax.configs import from_json
from isojax.planner import frontier
from isojax.planner import grids
from isojax.planner import prescribe

_RANGES = dict(max_batch_rollouts=1024, problems_range=(8, 1024), rollouts_range=(2, 2048))


def _base(b_p=16, lr=1e-4, ref=128):
  config = config_lib.base_config()
  config.problems_per_batch = b_p
  config.optim.learning_rate = lr
  config.optim.lr_reference_batch = ref
  return config


def test_paper_default_laws():
  hard = prescribe.default_law("hard", 16384)
  easy = prescribe.default_law("easy", 65536)
  assert 2 ** hard.log2_n_low == 8 and 2 ** hard.log2_n_high == 128
  assert 2 ** easy.log2_n_high == 512
  assert hard.c_mid == 32 * 16384 and easy.c_mid == 32 * 65536
  # n* climbs from ~8 and rounds to n_sat by the end of the documented range.
  assert float(hard.n_star(hard.compute_range[0])) < 10
  assert 2 ** round(float(hard.log2_n_star(hard.compute_range[1]))) == 128
  assert 2 ** round(float(easy.log2_n_star(easy.compute_range[1]))) == 512
  with pytest.raises(ValueError, match="difficulty='medium'"):
    prescribe.default_law("medium", 1024)


def test_difficulty_from_recipe():
  easy = config_lib.apply_recipe(config_lib.base_config(), "easy")
  hard = config_lib.apply_recipe(config_lib.base_config(), "hard")
  assert prescribe.difficulty_of(easy) == "easy"
  assert prescribe.difficulty_of(hard) == "hard"


def test_prescription_follows_the_law_and_the_square_root_rule():
  law = frontier.NStarLaw(log2_n_low=3, log2_n_high=6, b=1.0, c_mid=1e5,
                          compute_range=(1e3, 1e7))
  budget = 1_000_000
  result = prescribe.prescribe(budget, law, _base(b_p=16), min_steps=10, **_RANGES)
  n_star = 2 ** (3 + 3 / (1 + 1e5 / 1e6))  # the law by hand: ~52
  assert result.n_star == pytest.approx(n_star)
  a = result.allocation
  assert a.rollouts_per_problem == 2 ** round(math.log2(n_star)) == 64
  assert a.problems_per_batch == 16  # the base config's B_p, kept
  assert a.num_steps == budget // (16 * 64)
  assert result.run.effective_learning_rate == pytest.approx(1e-4 * math.sqrt(16 * 64 / 128))
  assert result.learning_rate == 1e-4
  d = result.to_dict()
  assert d["budget_rollouts"] == 16 * 64 * (budget // 1024) <= budget
  assert d["budget_rollouts_requested"] == budget and not d["extrapolated"]
  assert d == prescribe.prescribe(budget, law, _base(b_p=16), min_steps=10,
                                  **_RANGES).to_dict()  # deterministic


def test_large_n_lowers_b_p_before_n():
  law = frontier.NStarLaw(log2_n_low=9, log2_n_high=9, b=1.0, c_mid=1e3,
                          compute_range=(1e3, 1e7))  # n* = 512 everywhere
  a = prescribe.prescribe(10 ** 7, law, _base(b_p=64), **_RANGES).allocation
  # B_max = 1024 and B_p >= 8 cap n at 128; B_p falls to the 8 that n = 128 allows.
  assert (a.problems_per_batch, a.rollouts_per_problem) == (8, 128)


@settings(max_examples=100, deadline=None, database=None)
@given(budget=st.integers(160, 10 ** 7), log2_n=st.floats(0, 12), pref=st.integers(1, 2048),
       min_steps=st.integers(1, 50))
def test_choose_allocation_matches_brute_force(budget, log2_n, pref, min_steps):
  try:
    got = prescribe.choose_allocation(budget, 2 ** log2_n, preferred_problems=pref,
                                      min_steps=min_steps, **_RANGES)
  except grids.BudgetTooSmallError:
    assert budget < 8 * 2 * min_steps
    return
  feasible = [(b_p, n) for b_p in [2 ** i for i in range(3, 11)]
              for n in [2 ** i for i in range(1, 12)]
              if b_p * n <= 1024 and budget // (b_p * n) >= min_steps]
  rounded = 2 ** math.floor(log2_n + 0.5)
  ns = sorted({n for _, n in feasible})
  n = max([x for x in ns if x <= rounded], default=ns[0])
  b_p = min((bp for bp, x in feasible if x == n),
            key=lambda bp: (abs(math.log2(bp) - math.log2(pref)), bp))
  assert (got.problems_per_batch, got.rollouts_per_problem) == (b_p, n)
  assert got.num_steps == budget // (b_p * n) >= min_steps


def test_budget_too_small():
  law = prescribe.default_law("hard", 1024)
  with pytest.raises(grids.BudgetTooSmallError, match="needs 160 rollouts"):
    prescribe.prescribe(100, law, _base(), min_steps=10, **_RANGES)


def test_to_config_is_a_plain_dict_from_json_reads_and_keeps_the_base_lr(tmp_path):
  base = _base(b_p=16, lr=3e-4)
  fields = prescribe.to_config(grids.Allocation(32, 8, 40), base)
  assert type(fields) is dict and type(fields["optim"]) is dict
  assert (fields["problems_per_batch"], fields["rollouts_per_problem"],
          fields["num_steps"], fields["budget_rollouts"]) == (32, 8, 40, 32 * 8 * 40)
  assert fields["optim"]["learning_rate"] == 3e-4
  assert base.problems_per_batch == 16  # the base is copied, not changed
  # As launch.plan writes it, and as configs/from_json.py reads it for isojax.main.
  resolved = config_lib.resolve_dict(fields)
  assert resolved == fields  # nothing left to derive
  path = tmp_path / "plan.json"
  path.write_text(json.dumps(resolved))
  config = config_lib.resolve(from_json.get_config(str(path)))
  assert config_lib.settings(config).learning_rate == pytest.approx(3e-4 * math.sqrt(256 / 128))
  # A plain dict base gives the same prescription as the ConfigDict.
  assert prescribe.to_config(grids.Allocation(32, 8, 40), base.to_dict()) == fields


def test_to_config_errors_surface_when_resolved():
  fields = prescribe.to_config(grids.Allocation(32, 8, 40), _base())
  fields["budget_rollouts"] += 1
  with pytest.raises(ValueError, match="budget_rollouts=10241 disagrees"):
    config_lib.resolve_dict(fields)


def test_sweep_caps_b_p_by_the_training_set():
  base = _base()
  base.task.num_train = 64
  allocations = prescribe.sweep(1 << 16, base, **_RANGES)
  assert max(a.problems_per_batch for a in allocations) == 64
  assert all(a.rollouts == 1 << 16 for a in allocations)


def test_load_law(tmp_path):
  law = frontier.NStarLaw(log2_n_low=3, log2_n_high=6, b=1.2, c_mid=5e4,
                          compute_range=(1e3, 1e6))
  path = tmp_path / "analysis.json"
  path.write_text(json.dumps({"n_star_fit": law.to_dict()}))
  loaded = prescribe.load_law(str(path))
  assert (loaded.log2_n_low, loaded.log2_n_high, loaded.b, loaded.c_mid) == (3, 6, 1.2, 5e4)
  assert loaded.source.startswith("fit (")
  path.write_text(json.dumps({"n_star_fit": None}))
  with pytest.raises(ValueError, match="no `n_star_fit`"):
    prescribe.load_law(str(path))
  with pytest.raises(ValueError, match="does not exist"):
    prescribe.load_law(str(tmp_path / "missing.json"))
