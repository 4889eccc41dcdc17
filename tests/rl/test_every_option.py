"""Every registered option is reachable from a config field and trains one step."""

import jax
import numpy as np
import pytest
from flax import nnx

from isojax import config_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import advantages, downsampling, losses, rollout, update
from isojax.rl import batch as rl_batch
from isojax.sampling import sampler

_REGISTRIES = {"advantage": advantages.ADVANTAGE_ESTIMATORS,
               "policy_loss": losses.POLICY_LOSSES, "aggregation": losses.AGGREGATIONS,
               "kl_form": losses.KL_ESTIMATORS,
               "zero_variance_filter": update.ZERO_VARIANCE_MODES,
               "downsample": downsampling.DOWNSAMPLERS}
# The first name of each registry in the fast tier, the others in the full suite.
OPTIONS = [(field, name) if i == 0 else pytest.param(
    field, name, marks=pytest.mark.slow("each option compiles its own train step"))
           for field, names in _REGISTRIES.items() for i, name in enumerate(names)]


def _config(field, value):
  c = config_lib.base_config()
  c.rollouts_per_problem, c.problems_per_batch, c.num_steps = 4, 2, 1
  c.sampling.max_new_tokens = 3
  c.rl.update(kl_coef=0.1, entropy_coef=0.01, num_minibatches=2)
  c.rl[field] = value
  if field == "downsample":
    c.rl.train_rollouts_per_problem = 2
  return config_lib.resolve(c)


@pytest.mark.parametrize("field,value", OPTIONS)
def test_option_trains_one_step(field, value):
  config = _config(field, value)
  cfg = ModelConfig(vocab_size=11, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=16)
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  rng = np.random.default_rng(0)
  g, n, p, t = 2, 4, 2, 3
  rollouts = sampler.Rollouts(tokens=rng.integers(3, 11, (g * n, t)).astype(np.int32),
                              logprobs=-rng.uniform(1, 3, (g * n, t)).astype(np.float32),
                              mask=np.array([[1, 1, 1], [1, 1, 0]] * n, bool),
                              finished=np.array([False, True] * n),
                              forced=np.zeros((g * n, t), bool))
  scored = rollout.ScoredRollouts(
      prompts_GP=np.full((g, p), 4, np.int32), prompt_mask_GP=np.ones((g, p), bool),
      rollouts=rollouts, rewards_GN=np.array([[1, 0, 0, 1], [0, 1, 0, 0]], np.float32),
      completions=[""] * (g * n))
  batch, _ = rl_batch.build_train_batch(config, scored, select_rng=jax.random.key(0))
  settings = update.UpdateSettings.from_config(
      config, group_size=config_lib.train_rollouts_per_problem(config), prompt_len=p)
  logp = update.score(graphdef, params, batch.tokens, batch.mask, prompt_len=p,
                      temperature=settings.temperature)
  batch = batch.replace(old_logp=logp, ref_logp=logp - 0.1, shuffle_rng=jax.random.key(1))
  tx, _ = update.make_optimizer(config)
  before = jax.tree.map(np.array, params)
  new, _, stats = update.train_step(graphdef, params, tx.init(params), batch, tx=tx,
                                    settings=settings)
  assert np.isfinite(float(stats["loss"])) and float(stats["grad_norm"]) > 0
  changed = [not np.allclose(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(before),
                                                                jax.tree.leaves(new))]
  assert any(changed)


@pytest.mark.parametrize("field", ["advantage", "policy_loss", "aggregation", "kl_form",
                                   "zero_variance_filter", "downsample", "advantages_on"])
def test_unknown_option_is_a_clear_error(field):
  c = config_lib.base_config()
  c.num_steps = 1
  c.rl[field] = "nope"
  with pytest.raises(ValueError, match=f"rl.{field}='nope'"):
    config_lib.resolve(c)


@pytest.mark.parametrize("rl,match", [
    (dict(downsample="max_variance", train_rollouts_per_problem=9), "train_rollouts_per_problem=9"),
    (dict(downsample="none", train_rollouts_per_problem=4), "set rl.downsample"),
    (dict(downsample="max_variance", train_rollouts_per_problem=1), "train_rollouts_per_problem=1"),
])
def test_invalid_pods_combinations(rl, match):
  c = config_lib.base_config()
  c.num_steps, c.rollouts_per_problem = 1, 8
  c.rl.update(rl)
  with pytest.raises(ValueError, match=match):
    config_lib.resolve(c)


def test_pods_with_a_single_rollout():
  c = config_lib.base_config()
  c.num_steps, c.rollouts_per_problem = 1, 1
  c.rl.update(downsample="random", advantage="drgrpo")
  with pytest.raises(ValueError, match="PODS needs n > 1"):
    config_lib.resolve(c)
