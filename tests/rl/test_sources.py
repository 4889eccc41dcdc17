"""Which rollout source a config gets, and what each says a checkpoint and a stop hold.

That every source gives the batches the loop trained before it had sources is shown
end to end: the runs of every shipped config are bit-identical across the change
(`launch.check_identical`), and killed runs resume equal (tests/rl/test_off_policy_resume.py).
"""

import jax
import numpy as np
import pytest

from isojax.config import config_lib
from isojax.configs import dapo, hard, scalerl
from isojax.rl import sources


def _problems(config):
  s = config_lib.settings(config_lib.resolve(config))
  return sources.Problems(s.seed, s.rollouts_per_problem, s.problems_per_batch, s.rl,
                          s.sampling, graphdef=None, tok=None, book=None,
                          train_problems=list(range(64)), verifier=None, pool=None,
                          sample_key=jax.random.key(0))


@pytest.mark.parametrize("config,want,queue", [
    (hard.get_config("micro"), sources.Synchronous, None),
    (dapo.get_config("micro"), sources.DynamicSampling, None),
    (scalerl.get_config("micro"), sources.Pipelined, {}),
])
def test_each_config_gets_its_source_and_checkpoint_item(config, want, queue):
  source = sources.make(_problems(config), num_steps=3, batches=0, queue=None, snapshot=None)
  try:
    assert type(source) is want  # pylint: disable=unidiomatic-typecheck
    assert source.checkpoint_tree() == queue  # nothing sampled ahead yet
    assert source.discarded_rollouts() is None  # nothing a stop would lose
  finally:
    source.close()


def test_in_flight_counts_what_a_stop_discards():
  config = scalerl.get_config("micro")
  config.rl.off_policy = "pipeline_in_flight"
  source = sources.make(_problems(config), num_steps=3, batches=5, queue=None, snapshot=None)
  try:
    assert isinstance(source, sources.InFlight)
    assert source.checkpoint_tree() == {}  # nothing queued is saved in flight
    assert source.discarded_rollouts() == 0  # the thread has not started: nothing queued
  finally:
    source.close()


def test_problems_of_a_step_are_an_epoch_shuffle():
  """Brute force: the ids of steps 0..7 with B_p = 3 over 8 problems are the
  concatenated per-epoch permutations, cut into threes."""
  order = np.concatenate([np.random.default_rng([7, e]).permutation(8) for e in range(3)])
  for step in range(8):
    np.testing.assert_array_equal(sources.problems_for_step(7, step, 8, 3),
                                  order[3 * step:3 * step + 3])
