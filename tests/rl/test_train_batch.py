"""The loop's batch assembly (PODS rows, advantages, filters) and the composed loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from isojax.config import config_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import batch as rl_batch
from isojax.rl import rollout, update
from isojax.sampling import sampler


def _scored(rewards_GN, t=3, p=2, forced=None):
  g, n = rewards_GN.shape
  b = g * n
  forced = np.zeros((b, t), bool) if forced is None else forced
  tokens = np.arange(b * t).reshape(b, t) + 3  # unique rows, to identify selections
  return rollout.ScoredRollouts(
      prompts_GP=np.full((g, p), 5, np.int32), prompt_mask_GP=np.ones((g, p), bool),
      rollouts=sampler.Rollouts(tokens=jnp.asarray(tokens),
                                logprobs=-jnp.arange(b * t, dtype=jnp.float32).reshape(b, t),
                                mask=jnp.ones((b, t), bool), finished=jnp.ones((b,), bool),
                                forced=jnp.asarray(forced)),
      rewards_GN=np.asarray(rewards_GN, np.float32), completions=[""] * b)


def _config(**rl):
  """The `rl` settings of a run with n = 6, B_p = 2 and these `rl` fields."""
  c = config_lib.base_config()
  c.rollouts_per_problem, c.problems_per_batch, c.num_steps = 6, 2, 1
  c.rl.update(rl)
  return config_lib.settings(config_lib.resolve(c)).rl


def _build(rl, scored, select_rng, trained_rows=0):
  return rl_batch.build_train_batch(rl, scored, max_new_tokens=8, select_rng=select_rng,
                                    trained_rows=trained_rows)


def test_plain_grpo_batch():
  rewards = np.array([[1, 0, 0, 1, 0, 0], [1, 1, 1, 1, 1, 1]], np.float32)
  batch, zero_var = _build(_config(), _scored(rewards),
                                            select_rng=jax.random.key(0))
  r = rewards[0]
  np.testing.assert_allclose(np.asarray(batch.advantages[:6]),
                             (r - r.mean()) / (r.std() + 1e-6), rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(batch.advantages[6:]), 0)
  np.testing.assert_array_equal(zero_var, [False, True])
  assert batch.tokens.shape == (12, 5)


def test_pods_max_variance_rows_and_subset_advantages():
  rewards = np.array([[1, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0]], np.float32)
  config = _config(downsample="max_variance", train_rollouts_per_problem=2,
                   zero_variance_filter="all")
  scored = _scored(rewards)
  batch, zero_var = _build(config, scored, select_rng=jax.random.key(0))
  # Max variance with m = 2 keeps one correct and one wrong rollout per group.
  kept_rewards = []
  full_tokens, _ = rollout.sequences(scored, 6)
  for row in np.asarray(batch.tokens):
    (match,) = np.flatnonzero((full_tokens == row).all(axis=1))
    kept_rewards.append(rewards.reshape(-1)[match])
  assert sorted(kept_rewards[:2]) == [0, 1] and sorted(kept_rewards[2:]) == [0, 1]
  # Advantages on the selected pair: +-1 (up to eps).
  np.testing.assert_allclose(np.sort(np.asarray(batch.advantages).reshape(2, 2)),
                             [[-1, 1], [-1, 1]], atol=1e-5)
  np.testing.assert_array_equal(zero_var, [False, False])
  assert np.asarray(batch.keep_pg).all()


def test_decoupled_baseline_uses_generated_statistics():
  rewards = np.array([[1, 0, 0, 0, 0, 0], [1, 1, 0, 1, 0, 1]], np.float32)
  config = _config(downsample="max_reward", train_rollouts_per_problem=2,
                   advantages_on="generated")
  batch, _ = _build(config, _scored(rewards), select_rng=jax.random.key(0))
  full = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-6)
  # max_reward keeps indices [0, 1] of group 0 and [0, 1] of group 1.
  np.testing.assert_allclose(np.asarray(batch.advantages),
                             [full[0, 0], full[0, 1], full[1, 0], full[1, 1]], rtol=1e-5)


@pytest.mark.parametrize("mode,pg,reg", [("off", [1, 1], [1, 1]), ("all", [1, 0], [1, 0]),
                                         ("regularizers", [1, 1], [1, 0])])
def test_zero_variance_filter_modes(mode, pg, reg):
  rewards = np.array([[1, 0, 0, 1, 0, 0], [0] * 6], np.float32)
  batch, _ = _build(_config(zero_variance_filter=mode), _scored(rewards),
                                     select_rng=jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(batch.keep_pg), np.repeat(pg, 6))
  np.testing.assert_array_equal(np.asarray(batch.keep_reg), np.repeat(reg, 6))


def test_loss_fn_matches_numpy_objective():
  """PPO-clip token mean + k3 KL - entropy, recomputed in NumPy from model logits."""
  cfg = ModelConfig(vocab_size=13, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=24)
  model = Transformer(cfg, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(0)
  b, p, t = 4, 3, 4
  tokens = rng.integers(1, 13, size=(b, p + t))
  mask = np.ones((b, p + t), bool)
  response_mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], bool)
  mask[:, p:] = response_mask
  temperature = 0.7
  logits = np.asarray(model(tokens, mask), np.float64)[:, p - 1:-1] / temperature
  logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  logp = np.take_along_axis(logp_all, tokens[:, p:, None], -1)[..., 0]
  old = logp + rng.normal(0, 0.3, size=logp.shape)
  ref = logp + rng.normal(0, 0.3, size=logp.shape)
  adv = np.array([1.0, -0.5, 2.0, -1.0])
  ratio = np.exp(logp - old)
  pg = -np.minimum(ratio * adv[:, None], np.clip(ratio, 0.8, 1.2) * adv[:, None])
  kl = np.exp(ref - logp) - (ref - logp) - 1
  ent = -(np.exp(logp_all) * logp_all).sum(-1)
  m = response_mask
  expected = (pg[m].sum() + 0.1 * kl[m].sum() - 0.05 * ent[m].sum()) / m.sum()

  settings = update.UpdateSettings(
      group_size=2, prompt_len=p, temperature=temperature, policy_loss="ppo_clip",
      clip_eps=0.2, clip_eps_high=0.28, cispo_eps_max=4.0, aggregation="token_mean",
      constant_normalizer=4.0, kl_coef=0.1, kl_form="k3", entropy_coef=0.05,
      tis_threshold=0.0, num_minibatches=1, num_epochs=1)
  batch = update.TrainBatch(
      tokens=jnp.asarray(tokens), mask=jnp.asarray(mask), response_mask=jnp.asarray(m),
      sampler_logp=jnp.asarray(old, jnp.float32), old_logp=jnp.asarray(old, jnp.float32),
      ref_logp=jnp.asarray(ref, jnp.float32), advantages=jnp.asarray(adv, jnp.float32),
      keep_pg=jnp.ones(b, bool), keep_reg=jnp.ones(b, bool), shuffle_rng=jax.random.key(0))
  loss, _ = update.loss_fn(params, graphdef, batch, settings)
  assert float(loss) == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_overlong_modes_against_hand_computed_rewards():
  """rl.overlong on 4 rollouts: lengths 2, 6, 7, 8 of max 8; the last one truncated."""
  rewards = np.array([1, 1, 0, 1], np.float32)
  lengths = np.array([2, 6, 7, 8])
  finished = np.array([True, True, True, False])
  shape = lambda mode: rl_batch.shape_rewards(mode, rewards, lengths, finished,
                                              max_new_tokens=8, cache_tokens=4)
  np.testing.assert_allclose(shape("reward"), [1, 1, 0, 1])
  np.testing.assert_allclose(shape("zero"), [1, 1, 0, 0])
  # DAPO: 0 up to 8 - 4 = 4 tokens, then -(L - 4) / 4: 6 -> -0.5, 7 -> -0.75, 8 -> -1.
  np.testing.assert_allclose(shape("dapo"), [1, 0.5, -0.75, 0.0])
  config = config_lib.base_config()
  config.num_steps, config.rl.overlong = 1, "clip"
  with pytest.raises(ValueError, match=r"rl.overlong='clip': expected one of \['dapo', "):
    config_lib.resolve(config)  # the one check, before anything runs


def test_truncated_rollouts_earn_zero_in_the_batch():
  """With rl.overlong=zero a truncated correct rollout's advantage is a wrong one's."""
  rewards = np.array([[1, 1, 0, 0, 1, 0]], np.float32)
  scored = _scored(np.concatenate([rewards, rewards]))
  finished = np.ones(12, bool)
  finished[[0, 6]] = False  # the first rollout of each group hit max_new_tokens
  scored.rollouts = scored.rollouts.replace(finished=jnp.asarray(finished))
  config = _config(overlong="zero")
  batch, _ = _build(config, scored, select_rng=jax.random.key(0))
  r = np.array([0, 1, 0, 0, 1, 0], np.float32)
  np.testing.assert_allclose(np.asarray(batch.advantages[:6]),
                             (r - r.mean()) / (r.std() + 1e-6), rtol=1e-5)


def test_forced_interruption_tokens_are_context_not_actions():
  """The interruption text stays in the attention mask but leaves the loss mask, on the
  rows PODS keeps."""
  rewards = np.array([[1, 1, 1, 0, 1, 1], [0, 0, 1, 0, 0, 0]], np.float32)
  forced = np.zeros((12, 3), bool)
  forced[[1, 3, 8], 1] = True
  scored = _scored(rewards, forced=forced)
  config = _config(downsample="max_variance", train_rollouts_per_problem=2)
  batch, _ = _build(config, scored, select_rng=jax.random.key(0))
  full_tokens, _ = rollout.sequences(scored, 6)
  rows = [int(np.flatnonzero((full_tokens == r).all(axis=1))[0]) for r in np.asarray(batch.tokens)]
  np.testing.assert_array_equal(np.asarray(batch.response_mask), ~forced[rows])
  np.testing.assert_array_equal(np.asarray(batch.mask)[:, 2:], True)
  assert forced[rows].any()  # a kept row carries forced tokens


def test_unequal_groups_batch_against_each_groups_own_reference():
  """Per-problem allocation: groups of 4, 2, 4 and 2 rollouts; each row's advantage from
  its own group's rewards, its own prompt before its tokens, the zero-variance flags per
  group, and the `zero` overlong rule applied to the right rows."""
  sizes = np.array([4, 2, 4, 2])  # B = 12 = 4 problems x n 3 on average
  rewards_B = np.array([1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 1, 1], np.float32)
  finished_B = np.ones(12, bool)
  finished_B[3] = False  # the last rollout of problem 0 is truncated: it earns 0
  n_max, t, p = 6, 3, 2
  valid = np.arange(n_max)[None] < sizes[:, None]
  rewards_GN = np.zeros((4, n_max), np.float32)
  rewards_GN[valid] = rewards_B
  tokens = np.arange(12 * t).reshape(12, t) + 3
  prompts = np.arange(4 * p).reshape(4, p).astype(np.int32) + 100  # one prompt per problem
  scored = rollout.ScoredRollouts(
      prompts_GP=prompts, prompt_mask_GP=np.ones((4, p), bool),
      rollouts=sampler.Rollouts(tokens=jnp.asarray(tokens),
                                logprobs=-jnp.arange(12 * t, dtype=jnp.float32).reshape(12, t),
                                mask=jnp.ones((12, t), bool), finished=jnp.asarray(finished_B),
                                forced=jnp.zeros((12, t), bool)),
      rewards_GN=rewards_GN, completions=[""] * 12, group_sizes=sizes)
  c = config_lib.base_config()
  c.rollouts_per_problem, c.problems_per_batch, c.num_steps = 3, 4, 1
  c.rl.update(allocation="per_problem", allocation_n_max=6, advantage="drgrpo",
              overlong="zero")
  rl = config_lib.settings(config_lib.resolve(c)).rl
  batch, zero_var = _build(rl, scored, select_rng=jax.random.key(0))
  shaped_B = np.where(finished_B, rewards_B, 0.0)
  owner = np.repeat(np.arange(4), sizes)
  expected_adv = np.concatenate([
      shaped_B[owner == g] - shaped_B[owner == g].mean() for g in range(4)])
  np.testing.assert_allclose(np.asarray(batch.advantages), expected_adv, atol=1e-6)
  np.testing.assert_array_equal(batch.rewards, shaped_B)
  # Problem 0 [1, 0, 0, 0] and 2 [0, 1, 0, 0] vary; 1 [1, 1] and 3 [1, 1] do not.
  np.testing.assert_array_equal(zero_var, [False, True, False, True])
  np.testing.assert_array_equal(np.asarray(batch.tokens)[:, :p], prompts[owner])
  np.testing.assert_array_equal(np.asarray(batch.tokens)[:, p:], tokens)
  assert batch.keep_pg.all()  # rl.zero_variance_filter = off
  np.testing.assert_array_equal(batch.group_ids, owner)  # prompt_mean's groups


@pytest.mark.parametrize("advantages_on", ["selected", "generated"])
def test_unequal_groups_pods_against_a_brute_force_reference(advantages_on):
  """PODS under per-problem allocation: group g keeps min(n_g, m) of its own rollouts,
  the maximum-variance subset by brute force over every m-subset; advantages from the
  kept (or all generated) rewards of its own group; the batch padded to B_p * m with
  rows that no loss term sees, so every step has one shape."""
  import itertools
  from isojax.rl import losses
  sizes = np.array([6, 2, 5, 3])           # B = 16 = 4 problems x n 4; m = 3
  m, n_max, t, p = 3, 8, 3, 2
  rng = np.random.default_rng(0)
  rewards_B = rng.permutation(16).astype(np.float32) / 16   # distinct: one best subset
  valid = np.arange(n_max)[None] < sizes[:, None]
  rewards_GN = np.zeros((4, n_max), np.float32)
  rewards_GN[valid] = rewards_B
  tokens = np.arange(16 * t).reshape(16, t) + 3
  scored = rollout.ScoredRollouts(
      prompts_GP=np.arange(4 * p).reshape(4, p).astype(np.int32) + 100,
      prompt_mask_GP=np.ones((4, p), bool),
      rollouts=sampler.Rollouts(tokens=jnp.asarray(tokens),
                                logprobs=-jnp.arange(16 * t, dtype=jnp.float32).reshape(16, t),
                                mask=jnp.ones((16, t), bool), finished=jnp.ones(16, bool),
                                forced=jnp.zeros((16, t), bool)),
      rewards_GN=rewards_GN, completions=[""] * 16, group_sizes=sizes)
  c = config_lib.base_config()
  c.rollouts_per_problem, c.problems_per_batch, c.num_steps = 4, 4, 1
  c.rl.update(allocation="per_problem", allocation_n_max=n_max, downsample="max_variance",
              train_rollouts_per_problem=m, advantages_on=advantages_on)
  rl = config_lib.settings(config_lib.resolve(c)).rl
  batch, zero_var = _build(rl, scored, select_rng=jax.random.key(0), trained_rows=4 * m)
  with pytest.raises(ValueError, match="11 rollouts to train on, more than the batch's "
                     "trained_rows=10"):
    _build(rl, scored, select_rng=jax.random.key(0), trained_rows=10)

  offsets = np.cumsum(sizes) - sizes
  want_rows, want_adv = [], []
  for g, size in enumerate(sizes):
    r = rewards_B[offsets[g]:offsets[g] + size]
    keep = (tuple(range(size)) if size <= m else
            max(itertools.combinations(range(size), m), key=lambda s: np.var(r[list(s)])))
    base = r if advantages_on == "generated" else r[list(keep)]
    adv = (r[list(keep)] - base.mean()) / (base.std() + 1e-6)
    want_rows += [offsets[g] + j for j in keep]
    want_adv += list(adv)
  kept = len(want_rows)                    # 3 + 2 + 3 + 3 = 11 of B_p * m = 12
  assert batch.tokens.shape[0] == 4 * m and kept == 11
  np.testing.assert_array_equal(np.asarray(batch.tokens)[:kept, p:], tokens[want_rows])
  np.testing.assert_allclose(np.asarray(batch.advantages)[:kept], want_adv, rtol=1e-5,
                             atol=1e-6)
  np.testing.assert_array_equal(zero_var, [False] * 4)
  # The padding row: no action tokens, no loss term, no advantage.
  assert not np.asarray(batch.response_mask)[kept:].any()
  assert not np.asarray(batch.keep_pg)[kept:].any() and not np.asarray(batch.keep_reg)[kept:].any()
  assert (np.asarray(batch.advantages)[kept:] == 0).all()
  x = jnp.asarray(rng.normal(size=batch.response_mask.shape), jnp.float32)
  mask = jnp.asarray(batch.response_mask)
  for name in ("token_mean", "sequence_mean"):
    assert float(losses.aggregate(name, x, mask, group_size=1)) == pytest.approx(
        float(losses.aggregate(name, x[:kept], mask[:kept], group_size=1)), rel=1e-6)
  # prompt_mean's groups: each problem's kept rows (3, 2, 3, 3), the padding row in
  # group 0 without a token; every problem weighs the same, whatever it kept.
  np.testing.assert_array_equal(batch.group_ids, [0] * 3 + [1] * 2 + [2] * 3 + [3] * 3 + [0])
  x_np, mask_np = np.asarray(x), np.asarray(mask, np.float64)
  owner = np.asarray(batch.group_ids)[:kept]
  want = np.mean([(x_np[:kept][owner == g] * mask_np[:kept][owner == g]).sum()
                  / mask_np[:kept][owner == g].sum() for g in range(4)])
  assert float(losses.aggregate("prompt_mean", x, mask, group_size=1,
                                group_ids_B=jnp.asarray(batch.group_ids))) == pytest.approx(
                                    want, rel=1e-5)
