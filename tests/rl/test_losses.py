"""Policy losses, aggregations, KL, entropy and truncated IS against NumPy references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.special
from hypothesis import given, settings
from hypothesis import strategies as st

from isojax.rl import losses

# --------------------------------------------------------------------------------
# NumPy references (float64, written from the formulas, not from the JAX code).
# --------------------------------------------------------------------------------


def _policy_loss(name, **kwargs):
  """`losses.policy_loss` at the clips these tests compute by hand: PPO's 0.2, DAPO's
  upper 0.28 and CISPO's cap 4 (the settings' defaults), unless a test sets one."""
  return losses.policy_loss(name, **{"clip_eps": 0.2, "clip_eps_high": 0.28,
                                     "cispo_eps_max": 4.0, **kwargs})


def np_policy_loss(name, logp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.28,
                   eps_max=4.0):
  """Per-token loss, clip-active flags and the ratio the loss uses."""
  b, t = logp.shape
  loss = np.zeros((b, t))
  active = np.zeros((b, t), bool)
  ratios = np.ones((b, t))
  for i in range(b):
    valid = mask[i] > 0
    seq_ratio = np.exp(np.mean(logp[i][valid] - old[i][valid])) if valid.any() else 1.0
    for j in range(t):
      if not valid[j]:
        continue
      ratio = seq_ratio if name == "gspo" else np.exp(logp[i, j] - old[i, j])
      ratios[i, j] = ratio
      a = adv[i]
      if name == "cispo":
        loss[i, j] = -min(ratio, eps_max) * a * logp[i, j]
        active[i, j] = ratio > eps_max
        continue
      high = clip_eps_high if name == "dapo" else clip_eps
      surrogate = min(ratio * a, np.clip(ratio, 1 - clip_eps, 1 + high) * a)
      loss[i, j] = -surrogate
      active[i, j] = (a > 0 and ratio > 1 + high) or (a < 0 and ratio < 1 - clip_eps)
  return loss, active, ratios


def np_gspo_objective(logp, old, adv, mask, clip_eps=0.2):
  """The GSPO loss as the paper writes it: mean_i -min(s_i A_i, clip(s_i) A_i)."""
  terms = []
  for i in range(logp.shape[0]):
    valid = mask[i] > 0
    s = np.exp(np.mean(logp[i][valid] - old[i][valid]))
    terms.append(-min(s * adv[i], np.clip(s, 1 - clip_eps, 1 + clip_eps) * adv[i]))
  return np.mean(terms)


def np_aggregate(name, loss, mask, group_size, normalizer=None):
  loss = np.where(mask > 0, loss, 0.0)
  if name == "token_mean":
    return loss.sum() / max(mask.sum(), 1)
  if name == "constant":
    return loss.sum() / (loss.shape[0] * normalizer)
  if name == "sequence_mean":
    per_seq = [loss[i].sum() / mask[i].sum() for i in range(len(loss)) if mask[i].sum()]
    return np.mean(per_seq) if per_seq else 0.0
  if name == "prompt_mean":
    per_group = []
    for g in range(0, len(loss), group_size):
      count = mask[g:g + group_size].sum()
      if count:
        per_group.append(loss[g:g + group_size].sum() / count)
    return np.mean(per_group) if per_group else 0.0
  raise ValueError(name)


def random_batch(seed, b=6, t=5, spread=0.4):
  rng = np.random.default_rng(seed)
  old = rng.normal(-1.5, 0.5, size=(b, t))
  logp = old + rng.normal(0, spread, size=(b, t))
  adv = rng.normal(size=b)
  lengths = rng.integers(1, t + 1, size=b)
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)
  return logp, old, adv, mask


@pytest.fixture
def x64():
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  yield
  jax.config.update("jax_enable_x64", previous)


def _loss_fn(name, **kwargs):
  return functools.partial(_policy_loss, name, **kwargs)


# --------------------------------------------------------------------------------
# Policy losses.
# --------------------------------------------------------------------------------


def test_registries():
  assert set(losses.POLICY_LOSSES) == {"ppo_clip", "dapo", "cispo", "gspo"}
  assert set(losses.AGGREGATIONS) == {"token_mean", "sequence_mean", "constant", "prompt_mean"}
  assert set(losses.KL_ESTIMATORS) == {"k1", "k2", "k3"}


@pytest.mark.parametrize("name", ["ppo_clip", "dapo", "cispo", "gspo"])
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_loss_matches_numpy(name, seed):
  logp, old, adv, mask = random_batch(seed, spread=0.6 if name != "cispo" else 1.5)
  loss_bt, stats = jax.jit(_loss_fn(name, cispo_eps_max=2.0))(
      logp_BT=jnp.asarray(logp, jnp.float32), old_logp_BT=jnp.asarray(old, jnp.float32),
      advantages_B=jnp.asarray(adv, jnp.float32), mask_BT=jnp.asarray(mask, jnp.float32))
  ref, active, ratio = np_policy_loss(name, logp, old, adv, mask, eps_max=2.0)
  np.testing.assert_allclose(loss_bt, ref, rtol=1e-5, atol=1e-5)
  valid = mask > 0
  assert 0 < active[valid].mean() < 1, "test data should exercise both branches"
  np.testing.assert_allclose(stats["clip_fraction"], active[valid].mean(), atol=1e-6)
  np.testing.assert_allclose(stats["ratio_mean"], ratio[valid].mean(), rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_max"], ratio[valid].max(), rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_min"], ratio[valid].min(), rtol=1e-5)


def test_ppo_clip_and_dapo_hand_computed():
  # Token ratios 1.5, 1.25, 0.5, 0.9 with advantages +1, +1, -1, -1.
  old = jnp.zeros((4, 1))
  logp = jnp.log(jnp.array([[1.5], [1.25], [0.5], [0.9]]))
  adv = jnp.array([1.0, 1.0, -1.0, -1.0])
  mask = jnp.ones((4, 1))
  ppo, ppo_stats = _policy_loss("ppo_clip", logp_BT=logp, old_logp_BT=old,
                                      advantages_B=adv, mask_BT=mask)
  # min(1.5, 1.2) = 1.2; min(1.25, 1.2) = 1.2; min(-0.5, -0.8) = -0.8; min(-.9, -.9).
  np.testing.assert_allclose(ppo[:, 0], [-1.2, -1.2, 0.8, 0.9], atol=1e-6)
  np.testing.assert_allclose(ppo_stats["clip_fraction"], 0.75)
  dapo, dapo_stats = _policy_loss("dapo", logp_BT=logp, old_logp_BT=old,
                                        advantages_B=adv, mask_BT=mask)
  # Clip-higher at 1.28 lets the 1.25 ratio through.
  np.testing.assert_allclose(dapo[:, 0], [-1.28, -1.25, 0.8, 0.9], atol=1e-6)
  np.testing.assert_allclose(dapo_stats["clip_fraction"], 0.5)
  # A ratio above 1 + eps with a negative advantage is not clipped: min picks r * A.
  neg, neg_stats = _policy_loss("ppo_clip", logp_BT=jnp.log(jnp.array([[1.5]])),
                                      old_logp_BT=jnp.zeros((1, 1)),
                                      advantages_B=jnp.array([-1.0]), mask_BT=jnp.ones((1, 1)))
  np.testing.assert_allclose(neg, [[1.5]], atol=1e-6)
  assert neg_stats["clip_fraction"] == 0


def test_cispo_hand_computed():
  # ratio 5 > eps_max 4 is truncated to 4: loss = -4 * 2 * (-0.5) = 4; ratio e^0.1 not.
  logp = jnp.array([[-0.5, -1.0]])
  old = jnp.array([[-0.5 - np.log(5.0), -1.1]])
  loss_bt, stats = _policy_loss("cispo", logp_BT=logp, old_logp_BT=old,
                                      advantages_B=jnp.array([2.0]), mask_BT=jnp.ones((1, 2)))
  np.testing.assert_allclose(loss_bt, [[4.0, -np.exp(0.1) * 2 * -1.0]], rtol=1e-5)
  np.testing.assert_allclose(stats["clip_fraction"], 0.5)


def test_gspo_hand_computed():
  # Log-ratios 0.1 and 0.2 on the two valid tokens: s = exp(0.15), inside the clip.
  logp = jnp.array([[-1.0, -2.0, -5.0]])
  old = jnp.array([[-1.1, -2.2, 0.0]])
  loss_bt, stats = _policy_loss("gspo", logp_BT=logp, old_logp_BT=old,
                                      advantages_B=jnp.array([1.0]),
                                      mask_BT=jnp.array([[1, 1, 0]]))
  np.testing.assert_allclose(loss_bt, [[-np.exp(0.15), -np.exp(0.15), 0.0]], rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_max"], np.exp(0.15), rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_min"], np.exp(0.15), rtol=1e-5)


def _finite_difference(f, x, h=1e-6):
  grad = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    e = np.zeros_like(x)
    e[idx] = h
    grad[idx] = (f(x + e) - f(x - e)) / (2 * h)
  return grad


def _away_from_kinks(logp, old, high=0.2):
  ratio = np.exp(logp - old)
  return min(np.abs(ratio - (1 - 0.2)).min(), np.abs(ratio - (1 + high)).min()) > 1e-3


@pytest.mark.parametrize("name, aggregation", [
    ("ppo_clip", "token_mean"), ("dapo", "prompt_mean"), ("ppo_clip", "sequence_mean")])
def test_clipped_loss_gradient_matches_finite_differences(x64, name, aggregation):
  logp, old, adv, mask = random_batch(3)
  assert _away_from_kinks(logp, old, 0.28 if name == "dapo" else 0.2)

  def np_objective(lp):
    loss, _, _ = np_policy_loss(name, lp, old, adv, mask)
    return np_aggregate(aggregation, loss, mask, group_size=2)

  def jax_objective(lp):
    loss_bt, _ = _policy_loss(name, logp_BT=lp, old_logp_BT=jnp.asarray(old),
                                    advantages_B=jnp.asarray(adv), mask_BT=jnp.asarray(mask))
    return losses.aggregate(aggregation, loss_bt, jnp.asarray(mask), group_size=2)

  grad = jax.grad(jax_objective)(jnp.asarray(logp))
  assert grad.dtype == jnp.float64
  np.testing.assert_allclose(jax_objective(jnp.asarray(logp)), np_objective(logp), rtol=1e-10)
  np.testing.assert_allclose(grad, _finite_difference(np_objective, logp), atol=1e-7)
  assert np.any(grad == 0) and np.any(grad != 0), "clip should zero some gradients"


def test_cispo_gradient_matches_finite_differences_of_frozen_weight_objective(x64):
  # CISPO's gradient is that of -sum_t w_t A logp_t with w = min(ratio, eps_max)
  # held fixed (stop-gradient); the finite differences freeze w at the current point.
  logp, old, adv, mask = random_batch(4, spread=1.5)
  weights = np.minimum(np.exp(logp - old), 2.0)
  assert np.any(np.exp(logp - old)[mask > 0] > 2.0), "exercise the truncation"

  def np_objective(lp):
    return np_aggregate("token_mean", -weights * adv[:, None] * lp, mask, group_size=1)

  def jax_objective(lp):
    loss_bt, _ = _policy_loss("cispo", logp_BT=lp, old_logp_BT=jnp.asarray(old),
                                    advantages_B=jnp.asarray(adv), mask_BT=jnp.asarray(mask),
                                    cispo_eps_max=2.0)
    return losses.aggregate("token_mean", loss_bt, jnp.asarray(mask), group_size=1)

  grad = jax.grad(jax_objective)(jnp.asarray(logp))
  np.testing.assert_allclose(grad, _finite_difference(np_objective, logp), atol=1e-7)


def test_gspo_sequence_mean_is_the_gspo_objective_in_value_and_gradient(x64):
  logp, old, adv, mask = random_batch(5, spread=0.3)

  def jax_objective(lp):
    loss_bt, _ = _policy_loss("gspo", logp_BT=lp, old_logp_BT=jnp.asarray(old),
                                    advantages_B=jnp.asarray(adv), mask_BT=jnp.asarray(mask))
    return losses.aggregate("sequence_mean", loss_bt, jnp.asarray(mask), group_size=1)

  objective = functools.partial(np_gspo_objective, old=old, adv=adv, mask=mask)
  np.testing.assert_allclose(jax_objective(jnp.asarray(logp)), objective(logp), rtol=1e-10)
  grad = jax.grad(jax_objective)(jnp.asarray(logp))
  np.testing.assert_allclose(grad, _finite_difference(objective, logp), atol=1e-7)
  assert np.all(grad[mask == 0] == 0)


@pytest.mark.parametrize("name", ["ppo_clip", "dapo", "cispo", "gspo"])
def test_padding_with_inf_logp_stays_finite(name):
  logp = jnp.array([[-1.0, -jnp.inf], [-0.5, -0.7]])
  old = jnp.array([[-1.1, 0.0], [-0.4, jnp.nan]])
  mask = jnp.array([[1, 0], [1, 0]])

  def total(lp):
    loss_bt, _ = _policy_loss(name, logp_BT=lp, old_logp_BT=old,
                                    advantages_B=jnp.array([1.0, -1.0]), mask_BT=mask)
    return losses.aggregate("token_mean", loss_bt, mask, group_size=1)

  value, grad = jax.value_and_grad(total)(logp)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  assert grad[0, 0] != 0 and grad[0, 1] == 0


def test_policy_loss_errors_and_empty_mask():
  z = jnp.zeros((2, 3))
  with pytest.raises(ValueError, match="'nope'"):
    _policy_loss("nope", logp_BT=z, old_logp_BT=z, advantages_B=jnp.zeros(2), mask_BT=z)
  with pytest.raises(ValueError, match="advantages_B"):
    _policy_loss("ppo_clip", logp_BT=z, old_logp_BT=z, advantages_B=jnp.zeros(3),
                       mask_BT=z)
  loss_bt, stats = _policy_loss("ppo_clip", logp_BT=z + 1, old_logp_BT=z,
                                      advantages_B=jnp.ones(2), mask_BT=z)
  assert np.all(loss_bt == 0)
  assert stats == {"clip_fraction": 0.0, "ratio_mean": 1.0, "ratio_max": 1.0, "ratio_min": 1.0}


# --------------------------------------------------------------------------------
# Aggregation.
# --------------------------------------------------------------------------------

HAND_LOSS = np.array([[1, 1, 9], [2, 9, 9], [4, 4, 4], [0, 0, 9]], np.float32)
HAND_MASK = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], np.float32)


@pytest.mark.parametrize("name, group_size, expected", [
    ("token_mean", 2, 16 / 8),
    ("sequence_mean", 2, (1 + 2 + 4 + 0) / 4),
    ("prompt_mean", 2, (4 / 3 + 12 / 5) / 2),
    ("prompt_mean", 4, 16 / 8),
    ("prompt_mean", 1, (1 + 2 + 4 + 0) / 4),
    ("constant", 2, 16 / (4 * 4)),
])
def test_aggregate_hand_computed(name, group_size, expected):
  out = losses.aggregate(name, jnp.asarray(HAND_LOSS), jnp.asarray(HAND_MASK),
                         group_size=group_size, constant_normalizer=4.0)
  np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("name, expected", [
    ("token_mean", 16 / 8),
    ("sequence_mean", (1 + 2 + 4 + 0) / 4),
    ("prompt_mean", (4 / 3 + 12 / 5) / 2),
    ("constant", 16 / (6 * 4)),  # the constant counts every sequence
])
def test_masked_out_sequences_and_groups_do_not_dilute(name, expected):
  loss = np.concatenate([HAND_LOSS, np.full((2, 3), 7.0, np.float32)])
  mask = np.concatenate([HAND_MASK, np.zeros((2, 3), np.float32)])
  out = losses.aggregate(name, jnp.asarray(loss), jnp.asarray(mask), group_size=2,
                         constant_normalizer=4.0)
  np.testing.assert_allclose(out, expected, rtol=1e-6)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), groups=st.integers(1, 3), group_size=st.integers(1, 3),
       name=st.sampled_from(["token_mean", "sequence_mean", "constant", "prompt_mean"]))
def test_aggregate_matches_numpy(seed, groups, group_size, name):
  rng = np.random.default_rng(seed)
  b, t = groups * group_size, 4
  loss = rng.normal(size=(b, t))
  mask = (rng.random((b, t)) < 0.6).astype(np.float64)  # rows may be empty
  out = losses.aggregate(name, jnp.asarray(loss, jnp.float32), jnp.asarray(mask, jnp.float32),
                         group_size=group_size, constant_normalizer=3.0)
  expected = np_aggregate(name, loss, mask, group_size, normalizer=3.0)
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       pad=st.integers(0, 2))
def test_prompt_mean_over_unequal_groups_matches_numpy(seed, sizes, pad):
  """Per-problem allocation: group g holds sizes[g] rows (its id), then `pad` padding rows
  without tokens (id 0); each group's token mean, averaged over groups with a token."""
  rng = np.random.default_rng(seed)
  ids = np.concatenate([np.repeat(np.arange(len(sizes)), sizes), np.zeros(pad, int)])
  b, t = ids.size, 5
  loss = rng.normal(size=(b, t))
  mask = (rng.random((b, t)) < 0.6).astype(np.float64)
  mask[b - pad:] = 0
  real = ids[:b - pad]
  per_group = [(loss[:b - pad][real == g] * mask[:b - pad][real == g]).sum()
               / mask[:b - pad][real == g].sum()
               for g in range(len(sizes)) if mask[:b - pad][real == g].sum()]
  expected = np.mean(per_group) if per_group else 0.0
  args = (jnp.asarray(loss, jnp.float32), jnp.asarray(mask, jnp.float32))
  out = losses.aggregate("prompt_mean", *args, group_size=1,
                         group_ids_B=jnp.asarray(ids, jnp.int32))
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)
  w = losses.aggregation_weights("prompt_mean", args[1], group_size=1,
                                 group_ids_B=jnp.asarray(ids, jnp.int32))
  np.testing.assert_allclose(np.sum(np.asarray(w) * loss), expected, rtol=1e-5, atol=1e-6)
  if len(set(sizes)) == 1 and not pad:  # equal groups: the consecutive-group form
    # Two float32 summation orders of a mean that may be small beside its terms: the
    # tolerance of the NumPy comparisons above (rtol 1e-6 alone failed at a mean of
    # -0.003, 1.2e-8 apart).
    np.testing.assert_allclose(out, losses.aggregate("prompt_mean", *args,
                                                     group_size=sizes[0]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["token_mean", "sequence_mean", "constant", "prompt_mean"])
def test_aggregate_ignores_garbage_under_mask_and_empty_mask(name):
  loss = jnp.array([[1.0, jnp.nan], [jnp.inf, 2.0]])
  mask = jnp.array([[1, 0], [0, 1]], bool)
  out = losses.aggregate(name, loss, mask, group_size=2, constant_normalizer=2.0)
  assert np.isfinite(out) and out > 0
  empty = losses.aggregate(name, loss, jnp.zeros((2, 2)), group_size=2, constant_normalizer=2.0)
  assert empty == 0


def test_aggregate_errors():
  z = jnp.zeros((4, 3))
  with pytest.raises(ValueError, match="constant_normalizer"):
    losses.aggregate("constant", z, z, group_size=2)
  with pytest.raises(ValueError, match="group_size=3"):
    losses.aggregate("prompt_mean", z, z, group_size=3)
  with pytest.raises(ValueError, match="group_size"):
    losses.aggregate("token_mean", z, z, group_size=0)
  with pytest.raises(ValueError, match="'nope'"):
    losses.aggregate("nope", z, z, group_size=1)


# --------------------------------------------------------------------------------
# KL, entropy, truncated IS.
# --------------------------------------------------------------------------------


def test_kl_hand_computed():
  logp, ref = jnp.array([[0.0]]), jnp.array([[np.log(0.5)]])
  d = np.log(2.0)
  np.testing.assert_allclose(losses.kl_penalty("k1", logp, ref), [[d]], rtol=1e-6)
  np.testing.assert_allclose(losses.kl_penalty("k2", logp, ref), [[0.5 * d * d]], rtol=1e-6)
  np.testing.assert_allclose(losses.kl_penalty("k3", logp, ref), [[0.5 + d - 1]], rtol=1e-6)


@pytest.mark.parametrize("form", ["k1", "k2", "k3"])
def test_kl_matches_numpy(form):
  rng = np.random.default_rng(7)
  logp, ref = rng.normal(-2, 1, size=(3, 4)), rng.normal(-2, 1, size=(3, 4))
  d = ref - logp
  expected = {"k1": -d, "k2": 0.5 * d**2, "k3": np.exp(d) - d - 1}[form]
  out = losses.kl_penalty(form, jnp.asarray(logp, jnp.float32), jnp.asarray(ref, jnp.float32))
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("form", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_for_kl(form):
  # The exact expectation over x ~ p of the estimator equals KL(p || q).
  p = np.array([0.5, 0.3, 0.15, 0.05])
  q = np.array([0.25, 0.25, 0.25, 0.25])
  kl = np.sum(p * np.log(p / q))
  est = losses.kl_penalty(form, jnp.log(jnp.asarray(p))[None], jnp.log(jnp.asarray(q))[None])
  np.testing.assert_allclose(np.sum(p * np.asarray(est[0])), kl, rtol=1e-5)
  assert form != "k3" or np.all(np.asarray(est) >= 0)


def test_kl_unknown_form():
  with pytest.raises(ValueError, match="'k4'"):
    losses.kl_penalty("k4", jnp.zeros((1, 1)), jnp.zeros((1, 1)))


def test_token_entropy_matches_numpy():
  logits = np.random.default_rng(1).normal(0, 3, size=(2, 3, 7))
  p = scipy.special.softmax(logits, axis=-1)
  out = losses.token_entropy(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32))
  assert out.dtype == jnp.float32 and out.shape == (2, 3)
  np.testing.assert_allclose(losses.token_entropy(jnp.asarray(logits, jnp.float32)),
                             -np.sum(p * np.log(p), axis=-1), rtol=1e-5)
  np.testing.assert_allclose(losses.token_entropy(jnp.zeros((1, 1, 7))), [[np.log(7)]],
                             rtol=1e-6)


def test_token_entropy_bf16_large_and_masked_logits():
  assert losses.token_entropy(jnp.ones((1, 2, 5), jnp.bfloat16)).dtype == jnp.float32
  big = jnp.array([[[1e4, 0.0, -1e4]]])
  np.testing.assert_allclose(losses.token_entropy(big), [[0.0]], atol=1e-6)
  masked = jnp.array([[[0.0, -jnp.inf, 0.0]]])
  np.testing.assert_allclose(losses.token_entropy(masked), [[np.log(2)]], rtol=1e-6)
  grad = jax.grad(lambda x: losses.token_entropy(x).sum())(masked)
  assert np.all(np.isfinite(grad))


def np_importance(trainer, sampler, mask, threshold, level="token", mode="truncate",
                  sequence_ratio="product"):
  """The correction written with loops over sequences and tokens."""
  valid = mask > 0
  on = threshold is not None and threshold > 0
  weights = np.ones_like(trainer)
  truncated, masked, seq_kl = [], [], []
  for i in range(trainer.shape[0]):
    tokens = [t for t in range(trainer.shape[1]) if valid[i, t]]
    if not tokens:
      continue
    diffs = [trainer[i, t] - sampler[i, t] for t in tokens]
    seq_kl.append(sum(np.exp(d) - 1 - d for d in diffs))
    if level == "token":
      ratios = {t: np.exp(d) for t, d in zip(tokens, diffs)}
    else:
      log_ratio = sum(diffs) / (len(diffs) if sequence_ratio == "geometric" else 1)
      ratios = {t: np.exp(log_ratio) for t in tokens}
    units = list(ratios.values()) if level == "token" else [ratios[tokens[0]]]
    truncated += [on and mode == "truncate" and r > threshold for r in units]
    masked += [on and mode == "mask" and not 1 / threshold <= r <= threshold for r in units]
    for t, r in ratios.items():
      if on and mode == "truncate":
        weights[i, t] = min(r, threshold)
      elif on:
        weights[i, t] = r if 1 / threshold <= r <= threshold else 0.0
  diff = np.abs(trainer - sampler)[valid]
  stats = {"tis/mean_weight": weights[valid].mean(),
           "tis/truncated_fraction": np.mean(truncated),
           "tis/masked_fraction": np.mean(masked),
           "tis/max_abs_logp_diff": diff.max(),
           "tis/mean_abs_logp_diff": diff.mean(),
           "tis/sequence_kl": np.mean(seq_kl)}
  return weights, stats


def _mismatched_logps(seed=2, shape=(4, 5), noise=0.8):
  rng = np.random.default_rng(seed)
  trainer = rng.normal(-1, 1, size=shape)
  sampler = trainer + rng.normal(0, noise, size=shape)
  mask = (rng.random(shape) < 0.7).astype(np.float32)
  mask[0, 1] = 1.0
  mask[-1] = 0.0  # a sequence with no valid token
  sampler[mask == 0] = -np.inf  # padding garbage must not leak
  return trainer, sampler, mask


@pytest.mark.parametrize("threshold", [2.0, 1.1, None, 0.0, -1.0])
def test_truncated_is_weights_match_numpy(threshold):
  trainer, sampler, mask = _mismatched_logps()
  weights, stats = losses.importance_weights(
      jnp.asarray(trainer, jnp.float32), jnp.asarray(sampler, jnp.float32),
      jnp.asarray(mask), threshold)
  ref_w, ref_stats = np_importance(trainer, sampler, mask, threshold)
  np.testing.assert_allclose(weights, ref_w, rtol=1e-5)
  for key, value in ref_stats.items():
    np.testing.assert_allclose(stats[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
  if threshold is not None and threshold > 0:
    assert 0 < ref_stats["tis/truncated_fraction"] < 1
  else:
    assert np.all(np.asarray(weights) == 1)


@pytest.mark.parametrize("level,mode,sequence_ratio", [
    ("token", "mask", "product"), ("sequence", "truncate", "product"),
    ("sequence", "truncate", "geometric"), ("sequence", "mask", "product"),
    ("sequence", "mask", "geometric")])
def test_sequence_and_masked_importance_weights_match_numpy(level, mode, sequence_ratio):
  trainer, sampler, mask = _mismatched_logps(seed=5, shape=(8, 6), noise=0.4)
  threshold = 1.5
  weights, stats = jax.jit(functools.partial(
      losses.importance_weights, level=level, mode=mode, sequence_ratio=sequence_ratio))(
          jnp.asarray(trainer, jnp.float32), jnp.asarray(sampler, jnp.float32),
          jnp.asarray(mask), threshold)
  ref_w, ref_stats = np_importance(trainer, sampler, mask, threshold, level, mode,
                                   sequence_ratio)
  np.testing.assert_allclose(weights, ref_w, rtol=1e-5)
  for key, value in ref_stats.items():
    np.testing.assert_allclose(stats[key], value, rtol=1e-5, atol=1e-7, err_msg=key)
  # The seed gives rows on both sides of the threshold: the test can fail either way.
  fraction = ref_stats["tis/masked_fraction" if mode == "mask" else "tis/truncated_fraction"]
  assert 0 < fraction < 1
  if level == "sequence":  # one weight per sequence
    for row_w, row_mask in zip(np.asarray(weights), mask):
      assert len(set(row_w[row_mask > 0].round(6))) <= 1


def test_sequence_ratio_of_a_long_sequence_does_not_overflow():
  trainer = jnp.full((1, 400), 0.0)
  sampler = jnp.full((1, 400), -0.5)  # product of ratios e^200: beyond float32
  w, stats = losses.importance_weights(trainer, sampler, jnp.ones((1, 400)), 2.0,
                                       level="sequence")
  np.testing.assert_allclose(w, 2.0)
  assert np.isfinite(stats["tis/mean_weight"])
  w, _ = losses.importance_weights(trainer, sampler, jnp.ones((1, 400)), 2.0,
                                   level="sequence", mode="mask")
  np.testing.assert_array_equal(w, 0.0)


def test_truncated_is_weights_stop_gradient_and_traced_threshold():
  trainer, sampler = jnp.array([[-1.0, 1.0]]), jnp.array([[-0.5, 0.0]])
  mask = jnp.ones((1, 2))

  def weighted(tr):
    w, _ = losses.importance_weights(tr, sampler, mask, 2.0)
    return jnp.sum(w * tr)

  # With a stop-gradient the gradient is the weights themselves.
  np.testing.assert_allclose(jax.grad(weighted)(trainer), [[np.exp(-0.5), 2.0]], rtol=1e-6)
  jitted = jax.jit(losses.importance_weights)
  w_on, _ = jitted(trainer, sampler, mask, 2.0)
  w_off, stats = jitted(trainer, sampler, mask, 0.0)
  np.testing.assert_allclose(w_on, [[np.exp(-0.5), 2.0]], rtol=1e-6)
  np.testing.assert_array_equal(w_off, [[1.0, 1.0]])
  np.testing.assert_allclose(stats["tis/max_abs_logp_diff"], 1.0)
