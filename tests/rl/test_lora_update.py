"""LoRA's update: the adapters move, the base keeps its bits, Adam holds the adapters'
moments only, and the reference policy is the base without a copy of its weights."""

import jax
import numpy as np
import pytest

from isojax.configs import easy
from isojax.models import lora
from isojax.rl import rollout

RANK, ALPHA = 4, 8.0


def test_the_update_trains_the_adapters_only(run_parts_lora):
  """One RL step: every base weight keeps its bits, the adapters move, and Adam holds
  moments for the adapters alone."""
  learner, scored, before = run_parts_lora
  adapters_before, base_before = lora.split(before)
  learner.step(scored, select_rng=jax.random.key(0), shuffle_rng=jax.random.key(1))
  adapters_after, base_after = lora.split(learner.params)
  for x, y in zip(jax.tree.leaves(base_before), jax.tree.leaves(base_after), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  moved = [np.abs(np.asarray(x) - np.asarray(y)).max()
           for x, y in zip(jax.tree.leaves(adapters_before), jax.tree.leaves(adapters_after))]
  assert max(moved) > 0
  adapter_shapes = sorted(x.shape for x in jax.tree.leaves(adapters_after))
  moments = sorted(x.shape for x in jax.tree.leaves(learner.opt_state) if x.ndim)
  assert moments == sorted(adapter_shapes * 2)  # Adam's two moments, nothing else
  # The reference policy is the base: its log-probs are the base model's.
  ref = lora.disabled(learner.params)
  assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(lora.split(ref)[0]))
  assert all(x is y for x, y in zip(jax.tree.leaves(lora.split(ref)[1]),
                                    jax.tree.leaves(base_after)))  # shared, not copied


@pytest.fixture
def run_parts_lora(run_parts):
  config = easy.get_config("micro")  # pass rates near 0.6: groups with a signal
  config.model.lora.update(rank=RANK, alpha=ALPHA)
  config.optim.update(learning_rate=1e-2, warmup_steps=0)
  config, tok, problems, book, verifier, graphdef, learner = run_parts(config)
  scored = rollout.generate(graphdef, learner.params, tok, book, problems[:4], verifier, n=4,
                            rng=jax.random.key(3), sampling=config.sampling)
  before = jax.tree.map(lambda x: np.asarray(x).copy(), learner.params)
  return learner, scored, before
