"""Forced interruptions (ScaleRL): the sampler writes the interruption text into a
rollout still thinking at its budget, then allows `answer_budget` more tokens."""

import jax
import numpy as np
import pytest
from flax import nnx

from isojax.config import config_lib
from isojax.models import tokenizer as tokenizer_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import rollout
from isojax.sampling import sampler

PAD = 0
STOP = (8,)
TEXT = (5, 9, 13)      # the interruption text's ids
END = (21, 4)          # an end-of-thinking marker some rows generate within THINK tokens
THINK, ANSWER, T = 3, 2, 12


def _model():
  cfg = ModelConfig(vocab_size=23, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                    head_dim=8, mlp_dim=48, qk_norm=True, qkv_bias=True)
  model = Transformer(cfg, rngs=nnx.Rngs(3))
  state = jax.tree.map(lambda x: x * 8.0 if x.ndim == 2 else x, nnx.state(model))
  nnx.update(model, state)
  return model


def _prompts(g=12, p=6):
  rng = np.random.default_rng(1)
  lengths = rng.integers(2, p + 1, g)
  mask = np.arange(p)[None] >= (p - lengths)[:, None]
  return np.where(mask, rng.integers(1, 23, (g, p)), PAD).astype(np.int32), mask


def _reference(model, prompts, mask, end_ids):
  """Uncached greedy decoding of each row with the interruption rule applied by hand:
  (tokens, forced) lists per row."""
  width = prompts.shape[1] + T
  last_logits = jax.jit(lambda ids, keep: model(ids, keep)[:, -1])
  rows = []
  for row in range(len(prompts)):
    seq, new, forced = list(prompts[row][mask[row]]), [], []
    thinking, interrupted = True, False
    while len(new) < T:
      at = len(new)
      if interrupted and at >= THINK + len(TEXT) + ANSWER:
        break
      interrupted |= at == THINK and thinking
      if interrupted and THINK <= at < THINK + len(TEXT):
        token = TEXT[at - THINK]
      else:
        keep = np.arange(width) >= width - len(seq)
        ids = np.zeros(width, np.int32)
        ids[keep] = seq
        token = int(np.argmax(last_logits(ids[None], keep[None])[0]))
      forced.append(interrupted and THINK <= at < THINK + len(TEXT))
      new.append(token)
      seq.append(token)
      thinking &= tuple(new[-len(end_ids):]) != tuple(end_ids)
      if token in STOP:
        break
    rows.append((new, forced))
  return rows


@pytest.mark.parametrize("end_ids", [END, (14,)])  # (14,): a one-token marker
def test_lockstep_and_continuous_equal_an_uncached_reference(end_ids):
  model = _model()
  graphdef, state = nnx.split(model)
  prompts, mask = _prompts()
  cut = sampler.Interruption(THINK, TEXT, ANSWER, end_ids)
  kw = dict(n=2, max_new_tokens=T, temperature=0.0, stop_ids=STOP, pad_id=PAD,
            interruption=cut)
  key = jax.random.key(0)
  outs = {name: jax.tree.map(np.asarray, sampler.sample(
      graphdef, state, prompts, mask, key, sampler.SampleSpec(num_slots=slots, **kw)))
      for name, slots in (("lockstep", 0), ("continuous", 6))}
  expected = _reference(model, prompts, mask, end_ids)
  for name, out in outs.items():
    for b in range(len(out.tokens)):
      new, forced = expected[b // 2]
      assert out.tokens[b][out.mask[b]].tolist() == new, (name, b)
      assert out.forced[b][out.mask[b]].tolist() == forced, (name, b)
      assert out.finished[b] == (new[-1] in STOP), (name, b)
      assert (out.logprobs[b][out.forced[b]] == 0).all() and not out.forced[b][~out.mask[b]].any()
  lockstep = outs["lockstep"]
  interrupted = lockstep.forced.any(-1)
  lengths = lockstep.mask.sum(-1)
  # The workload holds every case: interrupted or not, ended by a stop id, by the
  # answer budget or by max_new_tokens.
  assert interrupted.any() and (~interrupted & (lengths > THINK)).any()
  assert (interrupted & (lengths == THINK + len(TEXT) + ANSWER) & ~lockstep.finished).any()
  assert (lengths[interrupted] <= THINK + len(TEXT) + ANSWER).all()
  np.testing.assert_array_equal(lockstep.interrupted, interrupted)


def _tok():
  return tokenizer_lib.build_char_tokenizer("0123456789+=<>/thinkOKy ")


@pytest.mark.parametrize("fields,message", [
    (dict(interruption_text="time is up"), "cannot be written"),
    (dict(answer_budget=9), r"exceed sampling.max_new_tokens=20"),
])
def test_interruption_that_does_not_fit_the_tokenizer_is_named(fields, message):
  c = config_lib.base_config()
  c.sampling.update(max_new_tokens=20, think_budget=4, answer_budget=2,
                    interruption_text="OK </think>", think_end_text="</think>")
  c.sampling.update(fields)
  with pytest.raises(ValueError, match=message):
    rollout.interruption(c.sampling, _tok())


def test_interruption_in_token_ids():
  c = config_lib.base_config()
  c.sampling.update(max_new_tokens=20, think_budget=4, answer_budget=2,
                    interruption_text="OK </think>", think_end_text="</think>")
  tok = _tok()
  cut = rollout.interruption(c.sampling, tok)
  assert cut.text_ids == tuple(tok.encode("OK </think>", add_bos=False))
  assert cut.think_end_ids == tuple(tok.encode("</think>", add_bos=False))
  assert cut.end == 4 + 11 + 2
  c.sampling.think_budget = 0
  assert rollout.interruption(c.sampling, tok) is None


@pytest.mark.parametrize("fields,message", [
    (dict(think_budget=-1), "sampling.think_budget=-1"),
    (dict(think_budget=4, answer_budget=0), "sampling.answer_budget=0"),
    (dict(think_budget=4, answer_budget=4), "must leave room"),
    (dict(think_budget=4, answer_budget=2, interruption_text=""), "interruption_text=''"),
])
def test_bad_interruption_fields_are_named(fields, message):
  c = config_lib.base_config()
  c.rollouts_per_problem, c.num_steps = 4, 1
  c.sampling.update(fields)
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(c)
