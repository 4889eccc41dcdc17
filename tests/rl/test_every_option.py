"""Every registered option is reachable from a config field and trains one step."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from isojax.config import config_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import advantages, downsampling, losses, optimizer, rollout, update
from isojax.rl import batch as rl_batch
from isojax.sampling import sampler

_REGISTRIES = {"advantage": advantages.ADVANTAGE_ESTIMATORS,
               "policy_loss": losses.POLICY_LOSSES, "aggregation": losses.AGGREGATIONS,
               "kl_form": losses.KL_ESTIMATORS,
               "zero_variance_filter": update.ZERO_VARIANCE_MODES,
               "downsample": downsampling.DOWNSAMPLERS}
# The first name of each registry trains one step in the fast tier; every name of each
# registry, side by side, in the full suite.
FIRST_OPTIONS = [(field, names[0] if isinstance(names, tuple) else next(iter(names)))
                 for field, names in _REGISTRIES.items()]
# Registries whose options must each give another loss or gradient on `_scored`'s batch.
# Not compared: PODS's down-samplers, which may choose the same rows on it, and the policy
# losses, which a one-minibatch step evaluates on-policy (the update scores the old
# log-probs in its own pass), where the ratio is 1 and PPO's, DAPO's and GSPO's clipped
# objectives have the same value and all four the same gradient; `test_losses.py`
# tells them apart off-policy against NumPy.
DISTINCT = ("advantage", "aggregation", "kl_form", "zero_variance_filter")


def _tiny_policy():
  cfg = ModelConfig(vocab_size=11, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=16)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))


def _config(field, value, num_minibatches=2, **optim):
  c = config_lib.base_config()
  c.optim.update(optim)
  c.rollouts_per_problem, c.problems_per_batch, c.num_steps = 4, 2, 1
  c.sampling.max_new_tokens = 3
  c.rl.update(kl_coef=0.1, entropy_coef=0.01, num_minibatches=num_minibatches)
  c.rl[field] = value
  if field == "downsample":
    c.rl.train_rollouts_per_problem = 2
  return config_lib.resolve(c)


def _scored(g: int = 2, n: int = 4, p: int = 2, t: int = 3) -> rollout.ScoredRollouts:
  """Two groups of four: the first all correct (zero variance), the second one in four.
  Response lengths differ within and between groups (3, 3, 3, 2 and 3, 2, 1, 1 tokens),
  so the aggregations weigh tokens, sequences and groups differently."""
  rng = np.random.default_rng(0)
  lengths = np.array([3, 3, 3, 2, 3, 2, 1, 1])
  rollouts = sampler.Rollouts(tokens=rng.integers(3, 11, (g * n, t)).astype(np.int32),
                              logprobs=-rng.uniform(1, 3, (g * n, t)).astype(np.float32),
                              mask=np.arange(t)[None, :] < lengths[:, None],
                              finished=lengths < t, forced=np.zeros((g * n, t), bool))
  return rollout.ScoredRollouts(
      prompts_GP=np.full((g, p), 4, np.int32), prompt_mask_GP=np.ones((g, p), bool),
      rollouts=rollouts, rewards_GN=np.array([[1, 1, 1, 1], [0, 1, 0, 0]], np.float32),
      completions=[""] * (g * n))


def _one_option_step(field, value):
  """(stats, parameters before, after) of one update under `rl.<field> = value`. The
  reference's log-probs differ from the policy's by up to 0.4 a token, so the KL forms
  differ.
  One minibatch holds both groups: split by group, a minibatch of the zero-variance
  group alone is empty under every filter, and one group's prompt mean is its token
  mean. No warm-up: the one optimizer update of the step moves the parameters."""
  config = _config(field, value, num_minibatches=1, warmup_steps=0)
  graphdef, params = _tiny_policy()
  s = config_lib.settings(config)
  p = 2
  batch, _ = rl_batch.build_train_batch(s.rl, _scored(p=p),
                                        max_new_tokens=s.sampling.max_new_tokens,
                                        select_rng=jax.random.key(0))
  settings = update.UpdateSettings.derive(s.rl, s.sampling,
                                          group_size=s.train_rollouts_per_problem, prompt_len=p)
  logp = np.asarray(update.score(graphdef, params, batch.tokens, batch.mask, prompt_len=p,
                                 temperature=settings.temperature))
  shift = np.resize(np.array([0.4, -0.4, 0.16], np.float32), logp.shape)
  batch = batch.replace(old_logp=logp, ref_logp=logp - shift, shuffle_rng=jax.random.key(1))
  tx, _ = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                warmup_steps=s.warmup_steps,
                                updates_per_step=s.rl.updates_per_step)
  before = jax.tree.map(np.array, params)
  new, _, stats = update.train_step(graphdef, params, tx.init(params), batch, tx=tx,
                                    settings=settings)
  return jax.device_get(stats), before, new


@pytest.mark.parametrize("field,value", FIRST_OPTIONS)
def test_option_trains_one_step(field, value):
  stats, before, new = _one_option_step(field, value)
  assert np.isfinite(float(stats["loss"])) and float(stats["grad_norm"]) > 0
  changed = [not np.allclose(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(before),
                                                                jax.tree.leaves(new))]
  assert any(changed)


@pytest.mark.slow("compiles one train step for each option of the registry")
@pytest.mark.parametrize("field", list(_REGISTRIES))
def test_every_option_trains_and_each_differs_from_the_others(field):
  """Each option of a registry reaches the update and trains; in `DISTINCT`'s
  registries no two options give the same loss and gradient norm, so a name wired to
  another's function fails here."""
  seen = {}
  for value in _REGISTRIES[field]:
    stats, before, new = _one_option_step(field, value)
    assert np.isfinite(float(stats["loss"])) and float(stats["grad_norm"]) > 0, value
    assert any(not np.allclose(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(before),
                                                                 jax.tree.leaves(new))), value
    seen[value] = np.array([float(stats["loss"]), float(stats["grad_norm"])])
  if field not in DISTINCT:
    return
  names = list(seen)
  for i, a in enumerate(names):
    for b in names[i + 1:]:
      assert not np.allclose(seen[a], seen[b], rtol=1e-5, atol=1e-7), (field, a, b, seen)


@pytest.mark.parametrize("field", ["advantage", "policy_loss", "aggregation", "kl_form",
                                   "zero_variance_filter", "downsample", "advantages_on",
                                   "is_level", "is_mode", "is_sequence_ratio"])
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


@pytest.mark.parametrize("threshold", [0.5, 1.0])
def test_importance_threshold_at_most_one_is_an_error(threshold):
  c = config_lib.base_config()
  c.num_steps = 1
  c.rl.tis_threshold = threshold
  with pytest.raises(ValueError, match=f"rl.tis_threshold={threshold}: expected > 1"):
    config_lib.resolve(c)


@pytest.mark.parametrize("level,mode", [("token", "truncate"), ("sequence", "truncate"),
                                        ("sequence", "mask"), ("token", "mask")])
def test_importance_correction_enters_the_update_loss(level, mode):
  """The update's loss against NumPy: with old = trainer log-probs the PPO ratio is 1, so
  each token's loss is -A_i times its correction weight, averaged over valid tokens."""
  config = _config("is_level", level)
  config.rl.update(is_mode=mode, kl_coef=0.0, entropy_coef=0.0, num_minibatches=1,
                   tis_threshold=1.5)
  graphdef, params = _tiny_policy()
  b, p, t = 4, 2, 3
  rng = np.random.default_rng(3)
  tokens = rng.integers(3, 11, (b, p + t)).astype(np.int32)
  mask = np.ones((b, p + t), bool)
  response = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], bool)
  mask[:, p:] = response
  logp = np.asarray(update.score(graphdef, params, tokens, mask, prompt_len=p, temperature=0.6))
  shift = np.array([[0.1, -0.2, 0.3], [0.6, 0.0, 0.0], [-0.9, 0.0, 0.0], [0.05, 0.05, 0.1]])
  sampler_logp = (logp - shift).astype(np.float32)  # trainer - sampler = shift
  adv = np.array([1.0, -0.5, 2.0, -1.0], np.float32)
  s = config_lib.settings(config)
  settings = dataclasses.replace(update.UpdateSettings.derive(
      s.rl, s.sampling, group_size=2, prompt_len=p), log_kl=False)
  batch = update.TrainBatch(tokens=tokens, mask=mask, response_mask=response,
                            sampler_logp=sampler_logp, old_logp=logp, ref_logp=logp,
                            advantages=adv, keep_pg=np.ones(b, bool),
                            keep_reg=np.ones(b, bool), shuffle_rng=jax.random.key(0))
  loss, stats = update.loss_fn(params, graphdef, batch, settings)
  ratio = np.exp(np.where(response, shift, 0.0))
  if level == "sequence":
    ratio = np.broadcast_to(np.prod(ratio, axis=1, keepdims=True), ratio.shape)
  w = np.minimum(ratio, 1.5) if mode == "truncate" else np.where(
      (ratio >= 1 / 1.5) & (ratio <= 1.5), ratio, 0.0)
  expected = np.sum(-adv[:, None] * w * response) / response.sum()
  # sequence-mask keeps rows 0 and 3, whose terms cancel: expected is 0, and float32
  # leaves a residue of the terms' rounding (about 1e-7 of their size, which is ~1).
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5, atol=1e-6)
  assert 0 < float(stats["tis/mean_weight"]) != 1.0


def _one_step(optim_fields):
  """The tiny policy's parameters before and after one train step under `optim_fields`."""
  config = _config("advantage", "grpo")
  s = config_lib.settings(config)
  optim = dataclasses.replace(s.optim, warmup_steps=0, **optim_fields)
  graphdef, params = _tiny_policy()
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, 11, (8, 5)).astype(np.int32)
  scored = rollout.ScoredRollouts(
      prompts_GP=np.full((2, 2), 4, np.int32), prompt_mask_GP=np.ones((2, 2), bool),
      rollouts=sampler.Rollouts(tokens=tokens, logprobs=np.zeros((8, 5), np.float32),
                                mask=np.ones((8, 5), bool), finished=np.ones(8, bool),
                                forced=np.zeros((8, 5), bool)),
      rewards_GN=np.array([[1, 0, 0, 1], [0, 1, 0, 0]], np.float32), completions=[""] * 8)
  batch, _ = rl_batch.build_train_batch(s.rl, scored, max_new_tokens=5,
                                        select_rng=jax.random.key(0))
  settings = update.UpdateSettings.derive(s.rl, s.sampling, group_size=4, prompt_len=2)
  logp = update.score(graphdef, params, batch.tokens, batch.mask, prompt_len=2,
                      temperature=settings.temperature)
  batch = batch.replace(old_logp=logp, ref_logp=logp, shuffle_rng=jax.random.key(1))
  tx, _ = optimizer.make_optimizer(optim, peak_learning_rate=1e-2, warmup_steps=0,
                                   updates_per_step=1)
  before = {optimizer.parameter_path(p): np.array(x)
            for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  new, _, _ = update.train_step(graphdef, params, tx.init(params), batch, tx=tx,
                                settings=settings)
  after = {optimizer.parameter_path(p): np.asarray(x)
           for p, x in jax.tree_util.tree_flatten_with_path(new)[0]}
  return before, after


def test_frozen_parameters_keep_their_values_and_decay_nothing():
  before, after = _one_step(dict(frozen=("embed", "layers/attn"), weight_decay=0.1))
  _, free = _one_step(dict(weight_decay=0.1))
  for path in before:
    if path == "embed/embedding" or path.startswith("layers/attn/"):
      np.testing.assert_array_equal(after[path], before[path], err_msg=path)
      assert not np.array_equal(free[path], before[path]), path  # they would have moved
    else:
      assert not np.array_equal(after[path], before[path]), path


def test_a_frozen_prefix_that_matches_nothing_is_named():
  from isojax.rl import settings as rl_settings  # pylint: disable=g-import-not-at-top
  tx, _ = optimizer.make_optimizer(rl_settings.OptimSettings(frozen=("embedding",)),
                                peak_learning_rate=1e-3, warmup_steps=0, updates_per_step=1)
  with pytest.raises(ValueError, match=r"optim.frozen: \['embedding'\] match no trained "
                     r"parameter; the trained parameters are \['embed/embedding'"):
    tx.init(_tiny_policy()[1])
  with pytest.raises(ValueError, match=r"optim.frozen='embed': expected a tuple"):
    rl_settings.OptimSettings(frozen="embed")
