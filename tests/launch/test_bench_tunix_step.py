"""The trl section's Tunix side: its settings against isojax's, its plumbing, RoPE.

`launch.bench --sections=trl --tunix_python=...` runs Tunix's GRPO learner in another
interpreter; what can be checked without Tunix is checked here: the settings it is
given, computed again from the config's fields; the optimizer against isojax's; the
tokenizer it is handed; the parent's bookkeeping of a third side. With Tunix
importable, its Llama with the RoPE patch computes isojax's logits on the same weights.
"""

import math
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from isojax.bench import report, trl_step, tunix_step
from isojax.bench.options import Options, check_options
from isojax.config import config_lib
from isojax.models import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def smollm2():
  """configs/smollm2.py:bench as the trl section runs it, unresolved (fields can be changed)."""
  return trl_step.run_config(trl_step.DEFAULT_CONFIG, 4)


def _settings(config, **rl):
  config = config.copy_and_resolve_references()
  config.rl.update(rl)
  return tunix_step.settings(config_lib.settings(config_lib.resolve(config)))


def test_tunix_is_given_the_configs_allocation_sampler_optimizer_and_clip(smollm2):
  t = _settings(smollm2)
  c = smollm2
  assert (t.num_generations, t.problems_per_step) == (c.rollouts_per_problem,
                                                      c.problems_per_batch) == (8, 8)
  assert t.max_tokens_to_generate == c.sampling.max_new_tokens == 64
  assert (t.temperature, t.top_p, t.top_k) == (c.sampling.temperature, 1.0, None)
  # The peak LR at B = B_p * n trained rollouts, sqrt-scaled from B_ref.
  assert c.optim.lr_scaling == "sqrt"
  batch = c.rollouts_per_problem * c.problems_per_batch
  assert t.learning_rate == pytest.approx(
      c.optim.learning_rate * math.sqrt(batch / c.optim.lr_reference_batch))
  assert t.learning_rate == pytest.approx(6e-5 * math.sqrt(0.5))
  assert t.warmup_steps == c.optim.warmup_steps == 10
  assert (t.b1, t.b2, t.weight_decay, t.grad_clip_norm) == (
      c.optim.b1, c.optim.b2, c.optim.weight_decay, c.optim.grad_clip_norm)
  # ppo_clip clips both sides at clip_eps; no KL, so no reference model.
  assert c.rl.policy_loss == "ppo_clip"
  assert (t.epsilon, t.epsilon_high) == (c.rl.clip_eps, c.rl.clip_eps) == (0.2, 0.2)
  assert (t.beta, t.loss_agg_mode, t.num_iterations) == (0.0, "token-mean", 1)
  # rl.micro_batch_size=0 (not planned): the whole batch in one pass.
  assert t.micro_batch_problems == c.problems_per_batch


@pytest.mark.parametrize("rollouts,problems", [(0, 8), (64, 8), (16, 2), (8, 1), (4, 1),
                                               (24, 2), (40, 4)])
def test_isojax_s_micro_batch_becomes_whole_groups_dividing_the_batch(rollouts, problems):
  """n = 8, B_p = 8: rollouts per pass -> problems per Tunix micro-batch."""
  assert tunix_step.micro_batch_problems(rollouts, 8, 8) == problems


def test_dapo_and_the_other_aggregation_and_scaling_map_too(smollm2):
  t = _settings(smollm2, policy_loss="dapo", aggregation="sequence_mean",
                micro_batch_size=16)
  assert (t.epsilon, t.epsilon_high) == (0.2, 0.28)
  assert t.loss_agg_mode == "sequence-mean-token-mean"
  assert t.micro_batch_problems == 2
  config = smollm2.copy_and_resolve_references()
  config.optim.update(lr_scaling="linear", warmup_steps=0)
  t = tunix_step.settings(config_lib.settings(config_lib.resolve(config)))
  assert t.learning_rate == pytest.approx(6e-5 * 64 / 128)
  assert t.warmup_steps == 0


@pytest.mark.parametrize("rl,field", [
    (dict(kl_coef=0.01), "rl.kl_coef"), (dict(advantage="rloo"), "rl.advantage"),
    (dict(policy_loss="cispo"), "rl.policy_loss"), (dict(aggregation="constant"),
                                                    "rl.aggregation"),
    (dict(num_minibatches=2), "rl.num_minibatches"),
    (dict(dynamic_sampling=True), "rl.dynamic_sampling")])
def test_settings_tunix_grpo_cannot_express_are_refused(smollm2, rl, field):
  with pytest.raises(ValueError, match=field):
    _settings(smollm2, **rl)


def test_the_optimizer_takes_isojax_s_steps(smollm2):
  from isojax.rl import optimizer  # pylint: disable=g-import-not-at-top
  config = config_lib.resolve(smollm2)
  s = config_lib.settings(config)
  ours, _ = optimizer.make_optimizer(s.optim, peak_learning_rate=s.learning_rate,
                                  warmup_steps=s.warmup_steps,
                                  updates_per_step=s.rl.updates_per_step)
  theirs = tunix_step.optimizer(tunix_step.settings(s))
  params = {"w": jnp.ones((3, 4)), "b": jnp.zeros(4)}
  rng = np.random.default_rng(0)
  a, b = ours.init(params), theirs.init(params)
  for _ in range(12):   # through the warm-up and past it
    grads = {k: jnp.asarray(rng.normal(size=v.shape) * 3, jnp.float32)
             for k, v in params.items()}
    ua, a = ours.update(grads, a, params)
    ub, b = theirs.update(grads, b, params)
    for k in params:
      np.testing.assert_allclose(ua[k], ub[k], rtol=1e-6, atol=1e-12)


def test_the_prompt_tokenizer_gives_isojax_s_ids_and_text():
  tok = tokenizer_lib.build_char_tokenizer("abc+=0123456789")
  known = "1+2="
  fake_ids = [7, 7, 7]   # whatever the prompt book holds for that text
  t = tunix_step.PromptTokenizer(tok, {known: fake_ids})
  assert t.encode(known) == fake_ids
  assert t.encode("12") == tok.encode("12", add_bos=False)
  assert t.bos_id() is None and t.pad_id() == tunix_step.PAD_ID == -1
  assert t.eos_id() == tok.eos_id
  ids = tok.encode("3", add_bos=False) + [tok.eos_id] + tok.encode("9", add_bos=False)
  assert t.decode(ids + [tunix_step.PAD_ID]) == "3"


def test_the_split_holds_only_with_each_generation_inside_its_step():
  assert tunix_step.nested([("step", 0, 10), ("generate", 1, 4), ("step", 10, 20),
                            ("generate", 10, 15)])
  assert not tunix_step.nested([("step", 0, 10), ("generate", 8, 12)])
  assert not tunix_step.nested([("step", 0, 10), ("generate", 1, 4), ("step", 10, 20)])


def _run(side, steps=3, **extra):
  return dict(generate_s=[9.0] + [1.0] * (steps - 1), step_s=[30.0] + [4.0] * (steps - 1),
              tokens=[100] * steps, reward=[0.1] * steps, peak_rss_gib=2.0, side=side, **extra)


def test_compare_runs_the_tunix_side_in_its_interpreter(monkeypatch):
  calls = []

  def child(side, config_path, steps, python=""):
    calls.append((side, python))
    if side.startswith("load_"):
      return dict(load_s=1.0)
    extra = dict(trl="1", torch="2", torch_threads=2) if side == "trl" else (
        dict(tunix="0.1.7", jax="0.10.2") if side == "tunix" else
        dict(profile=dict(update_flops=1.0)))
    r = _run(side, steps, **extra)
    if side == "tunix":
      r["step_s"] = [30.0] + [8.0] * (steps - 1)
    return r

  monkeypatch.setattr(trl_step, "_child", child)
  r = trl_step.compare(steps=3, rounds=2, tunix_python="/venv/bin/python")
  assert [c for c in calls if c[0] == "tunix"] == [("tunix", "/venv/bin/python")] * 2
  assert all(python == "" for side, python in calls if side != "tunix")
  assert r["tunix_over_isojax_step"] == pytest.approx(2.0)
  assert r["versions"]["tunix"] == "0.1.7"
  table = "\n".join(report.trl_table(r))
  assert "| tunix | 8.0 |" in table and "Tunix 2.00x" in table and "TRL 1.00x" in table
  calls.clear()
  r = trl_step.compare(steps=3, rounds=1)
  assert "tunix" not in r and all(side != "tunix" for side, _ in calls)
  assert "tunix" not in "\n".join(report.trl_table(r))


def test_the_comparison_runs_the_bench_preset_and_refuses_the_demo_recipe(monkeypatch):
  """Its default is the shipped demo's first recipe (a cut reply graded, 64 tokens, a
  10-step warm-up to reasoning.py's LR), which every side expresses; the demo itself
  scores a cut reply 0, which TRL's and Tunix's trainers cannot, and is refused before
  any side runs."""
  bench = trl_step.run_config(trl_step.DEFAULT_CONFIG, 4)
  assert (bench.rl.overlong, bench.sampling.max_new_tokens) == ("reward", 64)
  assert (bench.optim.warmup_steps, bench.optim.warmup_rollouts) == (10, 0)
  assert bench.optim.learning_rate == 6e-5  # the first recipe's, as trl.md measured it
  demo = trl_step.run_config("configs/smollm2.py", 4)
  assert (demo.rl.overlong, demo.optim.warmup_steps, demo.optim.warmup_rollouts) == (
      "zero", 0, 640)
  monkeypatch.setattr(trl_step, "_child", lambda *a, **k: pytest.fail("a side ran"))
  with pytest.raises(ValueError, match=r"configs/smollm2.py: rl.overlong='zero'.*"
                                       r"expected 'reward'"):
    trl_step.compare("configs/smollm2.py", steps=3, rounds=1)


def test_the_tunix_python_flag_is_checked_before_anything_runs():
  check_options(Options(sections=("trl",), tunix_python=sys.executable))
  with pytest.raises(ValueError, match="--tunix_python=/no/such/python"):
    check_options(Options(sections=("trl",), tunix_python="/no/such/python"))
  with pytest.raises(ValueError, match="add trl to --sections"):
    check_options(Options(sections=("update",), tunix_python=sys.executable))


def test_tunix_llama_with_the_rope_patch_computes_isojax_s_logits(tmp_path, monkeypatch):
  """A Llama whose RoPE theta is not Tunix's 1e6: equal logits only once patched."""
  pytest.importorskip("tunix")
  from tunix.models.llama3 import model as llama  # pylint: disable=g-import-not-at-top
  from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from isojax.models.transformer import ModelConfig, Transformer
  monkeypatch.setattr(llama, "apply_rope", llama.apply_rope)   # restored afterwards
  cfg = ModelConfig(vocab_size=64, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                    head_dim=8, mlp_dim=64, rope_theta=100.0, tie_embeddings=True)
  ours = Transformer(cfg, rngs=nnx.Rngs(0))
  hf_checkpoint.save_model(ours, str(tmp_path), eos_token_id=0, bos_token_id=0,
                           pad_token_id=0)
  theirs = tunix_step.load_llama(str(tmp_path))
  assert llama.apply_rope.keywords == {"rope_theta": 100.0}
  tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 24)), jnp.int32)
  expected = np.asarray(ours(tokens, jnp.ones(tokens.shape, bool)))

  def tunix_logits():
    positions = jnp.broadcast_to(jnp.arange(24), (2, 24))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((24, 24), bool)), (2, 24, 24))
    return np.asarray(theirs(tokens, positions, None, mask)[0])

  np.testing.assert_allclose(tunix_logits(), expected, atol=2e-5, rtol=1e-4)
  tunix_step.patch_rope(1_000_000)   # Tunix's own default: other logits past position 0
  assert not np.allclose(tunix_logits(), expected, atol=1e-3)
