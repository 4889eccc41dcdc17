"""The divergence guard as pure functions of synthetic per-step metrics."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from isojax.rl import guard


def _values(reward=0.5, grad_norm=0.1, loss=0.2):
  return {"train/reward": reward, "train/grad_norm": grad_norm, "train/loss": loss}


def _run_collapse(sequence, collapse_steps, stop=False):
  """Folds `guard.collapse` over (reward, grad_norm) pairs: steps 1, 2, ...; returns
  the streak after each step and the steps with an event."""
  streak, streaks, events = 0, [], []
  for step, (reward, grad_norm) in enumerate(sequence, start=1):
    streak, event = guard.collapse(_values(reward, grad_norm), streak=streak,
                                   collapse_steps=collapse_steps, stop=stop, step=step)
    streaks.append(streak)
    if event:
      events.append((step, event))
  return streaks, events


def _brute_force_events(sequence, k):
  """Steps ending the first k-long run of collapsed steps of each streak."""
  flags = [r == 0 and g == 0 for r, g in sequence]
  return [i + 1 for i in range(len(flags))
          if i + 1 >= k and all(flags[i + 1 - k:i + 1]) and (i + 1 == k or not flags[i - k])]


@pytest.mark.parametrize("seed", range(5))
def test_collapse_warns_once_per_streak_of_k(seed):
  rng = np.random.default_rng(seed)
  # Long stretches of collapsed steps (zero reward and gradient) among healthy ones.
  sequence = [(0.0, 0.0) if rng.random() < 0.7 else (float(rng.random()), 0.3)
              for _ in range(60)]
  streaks, events = _run_collapse(sequence, collapse_steps=3)
  assert [step for step, _ in events] == _brute_force_events(sequence, 3)
  assert all(e["event"] == "collapse" and e["steps"] == 3 for _, e in events)
  # The streak is the count of trailing collapsed steps.
  for i, streak in enumerate(streaks):
    trailing = 0
    while trailing <= i and sequence[i - trailing] == (0.0, 0.0):
      trailing += 1
    assert streak == trailing


def test_collapse_needs_zero_reward_and_zero_gradient():
  # Zero reward with a gradient (KL / entropy terms) or reward with zero gradient
  # (every group all-correct) are not a collapse.
  sequence = [(0.0, 1e-3)] * 5 + [(1.0, 0.0)] * 5 + [(0.0, 0.0)] * 2
  streaks, events = _run_collapse(sequence, collapse_steps=2)
  assert streaks == [0] * 10 + [1, 2]
  (step, event), = events
  assert step == 12 and "step 12" in event["message"]
  assert "set guard.stop_on_collapse=True to stop" in event["message"]
  _, events = _run_collapse(sequence, collapse_steps=2, stop=True)
  assert "the run stops" in events[0][1]["message"]


def test_collapse_steps_zero_disables_the_detector():
  streaks, events = _run_collapse([(0.0, 0.0)] * 10, collapse_steps=0)
  assert streaks == list(range(1, 11)) and events == []


def test_healthy_step_is_the_one_before_the_policy_that_began_the_streak():
  """Step s trains on rollouts of the policy after s - 1 updates. Zero reward at steps
  4, 5, 6 condemns the policies of steps 3 to 5; the rollouts of step 3, sampled by the
  policy of step 2, still earned reward."""
  rewards = {1: 0.2, 2: 0.1, 3: 0.1, 4: 0.0, 5: 0.0, 6: 0.0}
  streak = 0
  for step in range(1, 7):
    streak, _ = guard.collapse(_values(rewards[step], 0.0 if rewards[step] == 0 else 0.3),
                               streak=streak, collapse_steps=3, stop=False, step=step)
    first_zero = min((s for s in rewards if s <= step and rewards[s] == 0), default=None)
    want = None if first_zero is None else first_zero - 2
    assert guard.healthy_step(step, streak) == want
  assert guard.healthy_step(6, 3) == 2


@pytest.mark.parametrize("loss,grad_norm,params_finite,expected", [
    (0.2, 0.1, True, None),
    (math.nan, 0.1, True, ["train/loss"]),
    (0.2, math.inf, True, ["train/grad_norm"]),
    (math.nan, math.nan, False, ["train/loss", "train/grad_norm", "params"]),
    (0.2, 0.1, False, ["params"]),
])
def test_non_finite_names_each_quantity(loss, grad_norm, params_finite, expected):
  event = guard.non_finite(_values(loss=loss, grad_norm=grad_norm),
                           params_finite=params_finite, step=7)
  if expected is None:
    assert event is None
    return
  assert event["event"] == "non_finite" and event["quantities"] == expected
  assert event["message"].startswith("step 7: non-finite ")
  for name in expected:
    assert name in event["message"]


def test_all_finite_checks_every_float_leaf():
  tree = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4, jnp.bfloat16), "count": jnp.int32(3)}
  assert bool(guard.all_finite(tree))
  for leaf, bad in (("w", math.nan), ("b", math.inf)):
    broken = dict(tree, **{leaf: tree[leaf].at[1].set(bad)})
    assert not bool(guard.all_finite(broken))
