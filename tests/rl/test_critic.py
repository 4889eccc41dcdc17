"""PPO with a critic: GAE against a NumPy loop, the value loss and its clipping, where
the critic's gradient flows, its update, the run with its checkpoint, bad input."""

import importlib
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from isojax import run_dir
from isojax.config import config_lib
from isojax.models import hf_checkpoint, sharding
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import advantages, critic, update
from isojax.run import run_inputs, train


def np_gae(rewards, values, mask, gamma, lam):
  """GAE by the textbook loop over each row's valid tokens."""
  adv = np.zeros_like(values, dtype=np.float64)
  for b in range(values.shape[0]):
    steps = np.flatnonzero(mask[b])
    running, next_value = 0.0, 0.0
    for i, t in reversed(list(enumerate(steps))):
      reward = rewards[b] if i == len(steps) - 1 else 0.0
      delta = reward + gamma * next_value - values[b, t]
      running = delta + gamma * lam * running
      adv[b, t] = running
      next_value = values[b, t]
  return adv, np.where(mask, adv + values, 0.0)


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.0), (1.0, 1.0), (0.9, 0.7), (0.99, 0.95)])
def test_gae_matches_a_numpy_loop_with_masks_and_uneven_lengths(gamma, lam):
  rng = np.random.default_rng(0)
  b, t = 6, 7
  values = rng.normal(size=(b, t))
  mask = np.zeros((b, t), bool)
  for row, length in enumerate([7, 3, 1, 0, 5, 6]):
    mask[row, :length] = True
  mask[4, 2] = False  # forced context inside a response: skipped, not an action
  mask[5, 0] = False
  rewards = rng.integers(0, 2, b).astype(np.float64)
  adv, ret = advantages.gae(jnp.asarray(rewards), jnp.asarray(values, jnp.float32),
                            jnp.asarray(mask), gamma=gamma, lam=lam)
  ref_adv, ref_ret = np_gae(rewards, values, mask, gamma, lam)
  np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)
  if lam == 0:  # one-step TD: r_t + gamma V_{t+1} - V_t
    np.testing.assert_allclose(adv[0, 0], gamma * values[0, 1] - values[0, 0], rtol=1e-5)
  if gamma == lam == 1:  # Monte Carlo: the outcome minus the value, on every token
    np.testing.assert_allclose(adv[1, :3], rewards[1] - values[1, :3], rtol=1e-5)


def test_whiten_over_valid_tokens():
  x = np.array([[1.0, 2.0, 9.0], [3.0, 99.0, 99.0]])
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  got = np.asarray(advantages.whiten(jnp.asarray(x), jnp.asarray(mask)))
  valid = x[mask]
  np.testing.assert_allclose(got[mask], (valid - valid.mean()) / (valid.std() + 1e-6), rtol=1e-5)
  assert np.all(got[~mask] == 0)


@pytest.mark.parametrize("clip", [0.0, 0.2])
def test_value_loss_and_its_clipping_against_numpy(clip):
  rng = np.random.default_rng(1)
  v, old, ret = (rng.normal(size=(3, 4)) for _ in range(3))
  mask = rng.random((3, 4)) < 0.8
  loss, clipped = critic.value_loss(jnp.asarray(v), jnp.asarray(old), jnp.asarray(ret),
                                    jnp.asarray(mask), clip=clip)
  un = (v - ret) ** 2
  cl = (np.clip(v, old - clip, old + clip) - ret) ** 2 if clip else un
  np.testing.assert_allclose(loss, np.where(mask, 0.5 * np.maximum(un, cl), 0), rtol=1e-5)
  np.testing.assert_array_equal(clipped, mask & (cl > un))
  if clip:
    assert 0 < np.asarray(clipped).sum() < mask.sum()


def _tiny(vocab=11):
  cfg = ModelConfig(vocab_size=vocab, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=16)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))


def _create(config, mesh, graphdef, params):
  """`critic.create` as `train.run` calls it, from a config's settings."""
  s = config_lib.settings(config_lib.resolve(config))
  return s, critic.create(s.critic, s.rl, s.optim, s.model,
                          group_size=s.train_rollouts_per_problem,
                          warmup_steps=s.warmup_steps, mesh=mesh,
                          policy_graphdef=graphdef, policy_params=params)


def _critic(train_trunk, trunk="own", n=8, learning_rate=1e-4):
  config = config_lib.base_config()
  config.num_steps, config.rollouts_per_problem = 1, n
  config.critic.update(train_trunk=train_trunk, trunk=trunk, learning_rate=learning_rate)
  config.rl.num_minibatches = 2
  config.optim.warmup_steps = 0
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  graphdef, params = _tiny()
  params = jax.device_put(params, sharding.state_shardings(params, mesh))
  return (*_create(config, mesh, graphdef, params), params)


def test_values_read_the_policy_trunk_at_the_logit_positions():
  """V(s_t) = head(final_norm(h_{P-1+t})) of the policy's own hidden states."""
  config, c, policy_params = _critic(True)
  model = nnx.merge(c.graphdef, c.params)
  model.head.kernel[...] = jnp.linspace(-1, 1, 16)[:, None]
  model.head.bias[...] = jnp.array([0.3])
  _, state = nnx.split(model)
  rng = np.random.default_rng(2)
  tokens = rng.integers(0, 11, (3, 7)).astype(np.int32)
  mask = np.ones((3, 7), bool)
  mask[0, :2] = False  # left padding
  got = critic.values(c.graphdef, state, tokens, mask, prompt_len=3)
  policy = nnx.merge(_tiny()[0], policy_params)
  h = policy.final_norm(policy.hidden_states(jnp.asarray(tokens), jnp.asarray(mask)))
  expected = np.asarray(h)[:, 2:-1] @ np.linspace(-1, 1, 16) + 0.3
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  assert not hasattr(model.trunk, "lm_head")  # values need no LM head


@pytest.mark.parametrize("train_trunk", [False, True])
def test_the_critic_gradient_flows_only_where_configured(train_trunk):
  config, c, _ = _critic(train_trunk)
  rng = np.random.default_rng(3)
  tokens = rng.integers(0, 11, (4, 6)).astype(np.int32)
  mask = np.ones((4, 6), bool)
  response = np.ones((4, 4), bool)
  before = jax.tree.map(np.array, c.params)
  for step in range(2):  # the zero head passes no gradient to the trunk on step 1
    old = critic.values(c.graphdef, c.params, tokens, mask, prompt_len=2)
    _, ret = critic.advantages(jnp.array([1.0, 0.0, 1.0, 0.0]), old, response, gamma=1.0,
                               lam=1.0)
    batch = critic.ValueBatch(tokens, mask, response, old, ret, jax.random.key(step))
    c.params, c.opt_state, stats = critic.critic_step(
        c.graphdef, c.params, c.opt_state, batch, tx=c.tx,
        settings=critic.ValueUpdateSettings.derive(config.critic, config.rl, group_size=2,
                                                   prompt_len=2))
  changed = jax.tree.map(lambda a, b: bool(np.any(a != np.asarray(b))), before, c.params)
  assert all(jax.tree.leaves(changed["head"]))
  assert any(jax.tree.leaves(changed["trunk"])) == train_trunk
  if not train_trunk:  # no optimizer moments for a frozen trunk
    assert sum(x.size for x in jax.tree.leaves(c.opt_state)) < 4 * 17 + 8
  # The loss the step reports is the clipped value loss of the values it started from.
  loss, _ = critic.value_loss(old, old, ret, response, clip=0.2)
  assert float(stats["value_loss"]) <= float(jnp.sum(loss) / response.sum()) + 1e-6


def test_a_head_on_the_policy_trunk_reads_and_keeps_the_policy_weights():
  """critic.trunk='policy': the critic's state is the head alone; its values are the
  head on the policy's own hidden states; its update changes the head only, holds Adam
  moments for the head only, and leaves every policy weight's bits (not donated)."""
  # n = 2: 4 rollouts are two groups, one per minibatch
  _, c, policy_params = _critic(False, trunk="policy", n=2)
  assert set(c.params.keys()) == {"head"} and c.shares_policy_trunk
  c.params["head"]["kernel"][...] = jnp.linspace(-1, 1, 16)[:, None]
  c.params["head"]["bias"][...] = jnp.array([0.3])
  rng = np.random.default_rng(2)
  tokens = rng.integers(0, 11, (4, 7)).astype(np.int32)
  mask, response = np.ones((4, 7), bool), np.ones((4, 4), bool)
  got = critic.values(c.graphdef, c.params, tokens, mask, prompt_len=3,
                      frozen=critic.policy_trunk(policy_params))
  policy = nnx.merge(_tiny()[0], policy_params)
  h = policy.final_norm(policy.hidden_states(jnp.asarray(tokens), jnp.asarray(mask)))
  np.testing.assert_allclose(got, np.asarray(h)[:, 2:-1] @ np.linspace(-1, 1, 16) + 0.3,
                             rtol=1e-5, atol=1e-5)
  before_policy = jax.tree.map(np.array, policy_params)
  before_head = jax.tree.map(np.array, c.params)
  batch = update.TrainBatch(
      tokens=tokens, mask=mask, response_mask=response, sampler_logp=None, old_logp=None,
      ref_logp=None, advantages=None, keep_pg=None, keep_reg=None, shuffle_rng=None,
      rewards=jnp.array([1.0, 0.0, 1.0, 0.0]))
  targets = c.targets(batch, 3, policy_params)
  np.testing.assert_allclose(targets.batch.old_values, got)
  c.update(targets, jax.random.key(0), 3, policy_params)
  for x, y in zip(jax.tree.leaves(before_policy), jax.tree.leaves(policy_params), strict=True):
    np.testing.assert_array_equal(x, np.asarray(y))
  assert all(np.any(a != np.asarray(b)) for a, b in zip(
      jax.tree.leaves(before_head), jax.tree.leaves(c.params)))
  moments = sorted(x.shape for x in jax.tree.leaves(c.opt_state) if x.ndim)
  assert moments == [(1,), (1,), (16, 1), (16, 1)]
  with pytest.raises(ValueError, match="needs the policy's parameters"):
    c.targets(batch, 3)


def test_critic_update_fits_the_returns():
  config, c, _ = _critic(True, learning_rate=3e-3)
  rng = np.random.default_rng(4)
  tokens = rng.integers(0, 11, (8, 6)).astype(np.int32)
  mask, response = np.ones((8, 6), bool), np.ones((8, 4), bool)
  rewards = jnp.asarray(rng.integers(0, 2, 8), jnp.float32)
  losses = []
  for step in range(30):
    old = critic.values(c.graphdef, c.params, tokens, mask, prompt_len=2)
    _, ret = critic.advantages(rewards, old, response, gamma=1.0, lam=1.0)
    c.params, c.opt_state, stats = critic.critic_step(
        c.graphdef, c.params, c.opt_state,
        critic.ValueBatch(tokens, mask, response, old, ret, jax.random.key(step)), tx=c.tx,
        settings=critic.ValueUpdateSettings.derive(config.critic, config.rl, group_size=2,
                                                   prompt_len=2))
    losses.append(float(stats["value_loss"]))
  final = np.asarray(critic.values(c.graphdef, c.params, tokens, mask, prompt_len=2))
  # Monte Carlo returns are the rewards: the values move from 0 towards them.
  assert np.mean((final - np.asarray(rewards)[:, None]) ** 2) < 0.5 * np.mean(
      np.asarray(rewards) ** 2)
  assert losses[-1] < losses[0]


def _micro(**rl):
  config = importlib.import_module("isojax.configs.hard").get_config("micro")
  config.num_steps = 4
  config.eval.train_problems = 0
  config.rl.update(advantage="gae", **rl)
  return config


@pytest.mark.slow("three PPO runs with a critic, one resumed")
@pytest.mark.parametrize("trunk", ["own", "policy"])
def test_ppo_run_resumes_bit_identically(tmp_path, trunk):
  """A copy of a finished run, its last checkpoint removed, resumes from step 2 and logs
  what the whole run logged: the critic's state comes back with the policy's."""
  config = _micro()
  config.critic.update(warmup_steps=1, trunk=trunk, train_trunk=trunk == "own")
  whole, part = str(tmp_path / "whole"), str(tmp_path / "part")
  train.run(config, whole)
  shutil.copytree(whole, part)
  shutil.rmtree(os.path.join(run_dir.checkpoint_dir(part), "4"))
  train.run(config, part)
  strip = lambda rows: [run_dir.without_timings(r) for r in rows]
  assert strip(run_dir.read_metrics(part)) == strip(run_dir.read_metrics(whole))
  logged = [r for r in run_dir.read_metrics(whole) if "train/value_loss" in r]
  assert len(logged) == 4 and all(np.isfinite(r["train/value_loss"]) for r in logged)
  # Warm-up: step 1 trains the critic alone, so the policy's first update is step 2's.
  assert logged[0]["train/value_grad_norm"] > 0


def test_gae_allows_one_rollout_per_problem_and_group_estimators_do_not():
  config = _micro()
  config.rollouts_per_problem = 1
  config_lib.resolve(config)
  config.rl.advantage = "grpo"
  with pytest.raises(ValueError, match="rollouts_per_problem=1 with rl.advantage='grpo'"):
    config_lib.resolve(config)


@pytest.mark.parametrize("field,value,message", [
    ("critic.learning_rate", 0.0, "critic.learning_rate=0.0"),
    ("critic.value_clip", -0.1, "critic.value_clip=-0.1"),
    ("critic.warmup_steps", -1, "critic.warmup_steps=-1"),
    ("rl.gae_lambda", 1.5, "rl.gae_lambda=1.5"),
    ("rl.gamma", -0.1, "rl.gamma=-0.1"),
    ("critic.trunk", "shared", "critic.trunk='shared': expected one of"),
    ("critic.train_trunk", True, "critic.trunk='policy' trains the value head only"),
    ("critic.path", "/ckpt/critic", "critic.trunk='policy' reads the policy's own trunk"),
])
def test_bad_critic_fields_are_named(field, value, message):
  config = _micro()
  if field in ("critic.train_trunk", "critic.path"):
    config.critic.update(trunk="policy", train_trunk=False)
  section, name = field.split(".")
  config[section][name] = value
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(config)


def test_a_critic_checkpoint_with_another_vocabulary_is_refused_before_any_write(tmp_path):
  graphdef, params = _tiny(vocab=13)
  path = str(tmp_path / "critic")
  hf_checkpoint.save_model(nnx.merge(graphdef, params), path, eos_token_id=1, bos_token_id=0,
                             pad_token_id=0)
  config = _micro()
  config.critic.path = path
  workdir = str(tmp_path / "run")
  with pytest.raises(ValueError, match="critic.path=.*vocab_size 13 differs from the policy"):
    train.run(config, workdir)
  assert not os.path.exists(os.path.join(workdir, run_dir.CONFIG_FILE))


def test_a_critic_loaded_from_a_checkpoint_starts_from_its_weights(tmp_path):
  """critic.path: the trunk holds the checkpoint's tensors, not the policy's."""
  config = _micro()
  policy_path = run_inputs.policy_path(config_lib.settings(config))
  with open(os.path.join(policy_path, "config.json")) as f:
    vocab = json.load(f)["vocab_size"]
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  policy = hf_checkpoint.load_model(policy_path, mesh)
  graphdef, params = nnx.split(policy)
  other = jax.tree.map(lambda x: x * 0.5, params)
  path = str(tmp_path / "critic")
  hf_checkpoint.save_model(nnx.merge(graphdef, other), path, eos_token_id=1, bos_token_id=0,
                             pad_token_id=0)
  config.critic.path = path
  _, c = _create(config, mesh, graphdef, params)
  got = c.params["trunk"]["embed"]["embedding"][...]
  np.testing.assert_allclose(got, 0.5 * np.asarray(params["embed"]["embedding"][...]))
  assert got.shape[0] == vocab


def test_padding_rows_leave_the_critics_targets_and_update_unchanged():
  """Unequal groups (per-problem allocation) pad the batch to B_p * m rows with copies
  of row 0 that hold no response token and no reward: GAE, its whitening and the value
  regression see only the real rows, so the advantages, returns, loss and updated
  weights equal those of the real rows alone."""
  config = config_lib.base_config()
  config.num_steps, config.rollouts_per_problem = 1, 4
  config.optim.warmup_steps = 0
  mesh = sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": 1})
  graphdef, params = _tiny()
  params = jax.device_put(params, sharding.state_shardings(params, mesh))
  s, c = _create(config, mesh, graphdef, params)
  rng = np.random.default_rng(7)
  tokens = rng.integers(0, 11, (6, 6)).astype(np.int32)
  response = np.arange(4)[None, :] < rng.integers(1, 5, (6, 1))  # uneven lengths
  rewards = rng.integers(0, 2, 6).astype(np.float32)
  pad = lambda x, fill: np.concatenate([x, np.repeat(fill, 2, axis=0)])
  rows = dict(real=(tokens, response, rewards),
              padded=(pad(tokens, tokens[:1]), pad(response, np.zeros((1, 4), bool)),
                      pad(rewards, np.zeros(1, np.float32))))
  settings = critic.ValueUpdateSettings.derive(s.critic, s.rl, group_size=2, prompt_len=2)
  out = {}
  for name, (tok, resp, rew) in rows.items():
    mask = np.ones(tok.shape, bool)
    old = critic.values(c.graphdef, c.params, tok, mask, prompt_len=2)
    adv, ret = critic.advantages(jnp.asarray(rew), old, jnp.asarray(resp), gamma=1.0, lam=0.95)
    new_params, _, stats = critic.critic_step(
        c.graphdef, jax.tree.map(jnp.copy, c.params), jax.tree.map(jnp.copy, c.opt_state),
        critic.ValueBatch(tok, mask, resp, old, ret, jax.random.key(0)), tx=c.tx,
        settings=settings)
    out[name] = (np.asarray(adv)[:6], np.asarray(ret)[:6], float(stats["value_loss"]),
                 jax.tree.leaves(new_params))
  real, padded = out["real"], out["padded"]
  np.testing.assert_allclose(padded[0], real[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(padded[1], real[1], rtol=1e-6, atol=1e-7)
  assert padded[2] == pytest.approx(real[2], rel=1e-5)
  for a, b in zip(padded[3], real[3]):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
  assert np.abs(real[0]).sum() > 0  # the advantages are not trivially zero


@pytest.mark.slow("a 3-step PPO run with per-problem allocation")
def test_ppo_with_per_problem_allocation_trains_its_critic_on_unequal_groups(tmp_path):
  config = _micro(allocation="per_problem", allocation_n_max=8)
  config.num_steps, config.task.num_train = 3, 4  # the same 4 problems: history decides
  train.run(config, str(tmp_path / "run"))
  logged = [r for r in run_dir.read_metrics(str(tmp_path / "run")) if r["step"] > 0]
  sizes = [r["train/group_sizes"] for r in logged]
  n, b_p = config.rollouts_per_problem, config.problems_per_batch
  assert all(sum(s) == n * b_p and min(s) >= 2 and max(s) <= 8 for s in sizes)
  assert any(len(set(s)) > 1 for s in sizes)
  assert all(np.isfinite(r["train/value_loss"]) and np.isfinite(r["train/loss"])
             for r in logged)
