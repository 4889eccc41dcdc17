"""DAPO's dynamic sampling: rounds until B_p informative groups, the cap, the compute
counted, and the training loop against a plain loop that counts by hand."""

import importlib

import jax
import numpy as np
import pytest

from isojax import run_dir
from isojax.config import config_lib
from isojax.rl import dynamic_sampling, rollout, sources
from isojax.run import train
from isojax.sampling import sampler

N = 3


def _part(rewards_GN, prompt_len, tag):
  """A graded round whose token ids say (round tag, group, rollout)."""
  g = len(rewards_GN)
  b, t = g * N, 2
  tokens = (tag * 100 + np.arange(b)[:, None] + np.zeros((1, t), int)).astype(np.int32)
  rollouts = sampler.Rollouts(tokens=tokens, logprobs=np.zeros((b, t), np.float32),
                              mask=np.ones((b, t), bool), finished=np.ones(b, bool),
                              forced=np.zeros((b, t), bool))
  prompts = np.full((g, prompt_len), tag, np.int32)
  return rollout.ScoredRollouts(prompts, np.ones((g, prompt_len), bool), rollouts,
                                np.asarray(rewards_GN, np.float32),
                                [f"{tag}/{i}" for i in range(b)], verifier_timeouts=1,
                                timings={"sample_s": 1.0})


# Rounds of B_p = 4 groups; informative groups marked by mixed rewards.
ROUNDS = [
    [[0, 0, 0], [1, 0, 1], [1, 1, 1], [0, 0, 0]],   # 1 informative (group 1)
    [[0, 1, 0], [0, 0, 0], [1, 1, 0], [0, 0, 0]],   # 2 (groups 0, 2)
    [[1, 1, 1], [0, 0, 1], [1, 0, 0], [0, 1, 1]],   # 3 (groups 1, 2, 3)
]


def _draw(calls):
  def draw(round_index):
    calls.append(round_index)
    ids = np.arange(4) + 10 * round_index
    return ids, _part(ROUNDS[round_index], prompt_len=2 + round_index, tag=round_index)
  return draw


def _informative(scored):
  return scored.rewards_GN.max(axis=1) > scored.rewards_GN.min(axis=1)


def _expected_picks(max_rounds):
  """Brute force: every (round, group) in order; informative first, then the rest."""
  run = ROUNDS[:max_rounds]
  good = [(r, g) for r, groups in enumerate(run) for g, x in enumerate(groups) if len(set(x)) > 1]
  if len(good) >= 4:  # stop after the round that completes the batch
    last = good[3][0]
    run = run[:last + 1]
    good = good[:4]
  rest = [(r, g) for r, groups in enumerate(run) for g, x in enumerate(groups)
          if len(set(x)) == 1]
  return (good + rest)[:4], len(run)


@pytest.mark.parametrize("max_rounds", [8, 3, 2, 1])
def test_collect_fills_b_p_informative_groups_or_stops_at_the_cap(max_rounds):
  calls = []
  got = dynamic_sampling.collect(_draw(calls), problems_per_batch=4, max_rounds=max_rounds,
                                 informative=_informative)
  picks, rounds = _expected_picks(max_rounds)
  assert calls == list(range(rounds)) and got.rounds == rounds
  assert got.generated_rollouts == rounds * 4 * N  # every sampled rollout, kept or not
  assert got.chosen.tolist() == [10 * r + g for r, g in picks]
  np.testing.assert_array_equal(got.scored.rewards_GN, [ROUNDS[r][g] for r, g in picks])
  rows = [r * 100 + g * N + i for r, g in picks for i in range(N)]
  np.testing.assert_array_equal(got.scored.rollouts.tokens[:, 0], rows)
  assert got.scored.completions == [f"{r}/{g * N + i}" for r, g in picks for i in range(N)]
  # Prompts left-padded to the longest round's length, their text kept right-aligned.
  width = 2 + rounds - 1
  assert got.scored.prompts_GP.shape == (4, width)
  for (r, _), prompt, mask in zip(picks, got.scored.prompts_GP, got.scored.prompt_mask_GP):
    assert mask.tolist() == [False] * (width - 2 - r) + [True] * (2 + r)
    assert set(prompt[mask].tolist()) == {r}
  assert got.scored.verifier_timeouts == rounds and got.scored.timings["sample_s"] == rounds
  informative = _informative(got.scored).sum()
  assert informative == min(4, sum(len(set(x)) > 1 for rnd in ROUNDS[:rounds] for x in rnd))


def _unequal_part(sizes, rewards_B, tag, n_max=6):
  """A graded round of unequal groups (per-problem allocation), rewards padded to n_max."""
  b, t = int(sum(sizes)), 2
  rewards_GN = np.zeros((len(sizes), n_max), np.float32)
  rewards_GN[np.arange(n_max)[None] < np.asarray(sizes)[:, None]] = rewards_B
  tokens = (tag * 100 + np.arange(b)[:, None] + np.zeros((1, t), int)).astype(np.int32)
  rollouts = sampler.Rollouts(tokens=tokens, logprobs=np.zeros((b, t), np.float32),
                              mask=np.ones((b, t), bool), finished=np.ones(b, bool),
                              forced=np.zeros((b, t), bool))
  return rollout.ScoredRollouts(np.full((len(sizes), 2), tag, np.int32),
                                np.ones((len(sizes), 2), bool), rollouts, rewards_GN,
                                [f"{tag}/{i}" for i in range(b)],
                                group_sizes=np.asarray(sizes))


# Rounds of B_p = 3 problems, 12 rollouts each (n = 4), split unequally.
UNEQUAL = [([6, 4, 2], [0] * 6 + [1, 0, 1, 1] + [1, 1]),        # informative: group 1
           ([2, 5, 5], [0, 0] + [0, 1, 0, 0, 0] + [1, 1, 0, 0, 0]),  # groups 1 and 2
           ([4, 4, 4], [1, 0, 0, 0] + [1] * 4 + [0, 0, 1, 0])]  # groups 0 and 2


@pytest.mark.parametrize("max_rounds", [3, 2, 1])
def test_collect_keeps_unequal_groups_within_the_steps_rollouts(max_rounds):
  """Per-problem allocation: informative groups first, then the rest, each taken in
  round order only while its rollouts fit B_p * n = 12; every group keeps its own
  rollouts, and every sampled rollout counts."""
  def draw(r):
    return np.arange(3) + 10 * r, _unequal_part(*UNEQUAL[r], tag=r)
  informative = lambda s: np.asarray(
      [np.ptp(s.rewards_GN[g, :size]) > 0 for g, size in enumerate(s.group_sizes)])
  got = dynamic_sampling.collect(draw, problems_per_batch=3, max_rounds=max_rounds,
                                 informative=informative, max_rows=12)
  # Brute force: rounds until 3 informative groups (or the cap), then the greedy fit.
  good, rest, rounds = [], [], 0
  while len(good) < 3 and rounds < max_rounds:
    sizes, rewards = UNEQUAL[rounds]
    starts = np.cumsum(sizes) - sizes
    for g, size in enumerate(sizes):
      mixed = len(set(rewards[starts[g]:starts[g] + size])) > 1
      (good if mixed else rest).append((rounds, g, size, starts[g]))
    rounds += 1
  picks, used = [], 0
  for r, g, size, start in good + rest:
    if len(picks) < 3 and used + size <= 12:
      picks.append((r, g, size, start))
      used += size
  assert got.rounds == rounds and got.generated_rollouts == 12 * rounds
  assert got.chosen.tolist() == [10 * r + g for r, g, _, _ in picks]
  np.testing.assert_array_equal(got.scored.group_sizes, [size for _, _, size, _ in picks])
  np.testing.assert_array_equal(got.scored.rollouts.tokens[:, 0], [
      r * 100 + start + i for r, _, size, start in picks for i in range(size)])
  np.testing.assert_array_equal(got.scored.rewards_B, [
      UNEQUAL[r][1][start + i] for r, _, size, start in picks for i in range(size)])
  assert got.scored.rewards_B.size <= 12
  if max_rounds > 1:  # the cap binds: round 1's second group (5) does not fit after 4 + 5
    assert [(r, g) for r, g, _, _ in picks] == [(0, 1), (1, 1), (0, 2)]


def test_extra_rounds_draw_distinct_problems_as_a_function_of_the_step():
  a = dynamic_sampling.extra_problems(0, 5, 1, 100, 16)
  assert len(set(a.tolist())) == 16
  np.testing.assert_array_equal(a, dynamic_sampling.extra_problems(0, 5, 1, 100, 16))
  assert not np.array_equal(a, dynamic_sampling.extra_problems(0, 5, 2, 100, 16))


def _micro(**rl):
  config = importlib.import_module("isojax.configs.hard").get_config("micro")
  config.num_steps = 3
  config.eval.train_problems = 0
  config.rl.update(dynamic_sampling=True, **rl)
  return config


@pytest.mark.parametrize("rl", [dict(dynamic_sampling_max_rounds=3),
                                dict(dynamic_sampling_max_rounds=2, max_staleness=1)])
def test_run_trains_on_the_groups_a_plain_loop_collects(tmp_path, rl, run_parts):
  """train.run against a loop that samples every round with `rollout.generate` and
  picks the groups by NumPy; the counters hold every generated rollout."""
  config = _micro(**rl)
  train.run(config, str(tmp_path / "run"))
  logged = [r for r in run_dir.read_metrics(str(tmp_path / "run")) if r["step"] > 0]

  config, tok, problems, book, verifier, graphdef, learner = run_parts(config)
  sample_key, _, shuffle_key, select_key = jax.random.split(jax.random.key(config.seed), 4)
  n, b_p = config.rollouts_per_problem, config.problems_per_batch
  cap = rl["dynamic_sampling_max_rounds"]
  params = [jax.tree.map(np.asarray, learner.params)]
  total, saw_extra = 0, False
  for step, record in enumerate(logged):
    source = params[max(0, step - config.rl.max_staleness)]
    parts, kept, spare = [], [], []
    while len(kept) < b_p and len(parts) < cap:
      r = len(parts)
      ids = (sources.problems_for_step(config.seed, step, len(problems), b_p) if r == 0
             else dynamic_sampling.extra_problems(config.seed, step, r, len(problems), b_p))
      key = jax.random.fold_in(sample_key, step)
      parts.append(rollout.generate(graphdef, source, tok, book, [problems[i] for i in ids],
                                    verifier, n=n, rng=jax.random.fold_in(key, r) if r else key,
                                    sampling=config.sampling))
      for g, rewards in enumerate(parts[-1].rewards_GN):
        (kept if np.ptp(rewards) > 0 else spare).append((r, g))
    picks = (kept + spare)[:b_p]
    rounds = len(parts)
    total += rounds * b_p * n
    saw_extra |= rounds > 1
    assert record["train/sampling_rounds"] == rounds
    assert record["train/generated_rollouts"] == rounds * b_p * n
    assert record["rollouts"] == total
    picked = np.asarray([parts[r].rewards_GN[g] for r, g in picks])
    assert record["train/reward"] == pytest.approx(float(picked.mean()), abs=1e-6)
    assert record["train/zero_variance_fraction"] == pytest.approx(
        max(0, b_p - len(kept)) / b_p)
    # The next version, trained as the run did on the groups picked here.
    result = learner.step(dynamic_sampling.take_groups(parts, picks, n),
                          select_rng=jax.random.fold_in(select_key, step),
                          shuffle_rng=jax.random.fold_in(shuffle_key, step))
    assert record["train/loss"] == pytest.approx(float(result.stats["loss"]), abs=1e-6)
    params.append(jax.tree.map(np.asarray, learner.params))
  assert saw_extra  # the test covers further rounds


@pytest.mark.parametrize("rl,message", [
    (dict(dynamic_sampling_max_rounds=0), "rl.dynamic_sampling_max_rounds=0"),
    (dict(max_staleness=2, off_policy="pipeline_in_flight"), "pipeline_in_flight"),
])
def test_bad_dynamic_sampling_fields_are_named(rl, message):
  config = _micro(**rl)
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(config)


def test_dynamic_sampling_needs_a_group():
  config = _micro(advantage="drgrpo")
  config.rollouts_per_problem = 1
  with pytest.raises(ValueError, match="rl.dynamic_sampling with rollouts_per_problem=1"):
    config_lib.resolve(config)
