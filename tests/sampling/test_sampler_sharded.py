"""Data-parallel sampling on 8 fake CPU devices, and steps split into sampler calls.

The multi-device test runs a child Python with XLA_FLAGS set before JAX starts.
"""

import threading

import jax
import numpy as np
import pytest
from flax import nnx

from isojax import tasks
from isojax.config import config_lib
from isojax.models.transformer import ModelConfig, Transformer
from isojax.rl import rollout
from isojax.sampling import sampler
from isojax.sampling import settings as sampling_settings
from isojax.tasks import prompts

SETTINGS = dict(max_new_tokens=6, temperature=1.0, stop_ids=(2,), pad_id=0)



@pytest.mark.slow("compiles the sampler for one and for eight fake devices, in a subprocess")
def test_rollouts_are_split_over_devices_and_equal_single_device(on_8_devices):
  code = """
    import jax, numpy as np
    from flax import nnx
    from isojax.models import sharding
    from isojax.models.transformer import ModelConfig, Transformer
    from isojax.sampling import sampler
    assert jax.device_count() == 8
    cfg = ModelConfig(vocab_size=24, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=48, qkv_bias=True)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    prompts = rng.integers(3, 24, size=(8, 5)).astype(np.int32)
    mask = np.ones_like(prompts, bool); mask[::3, :2] = False
    settings = dict(n=2, max_new_tokens=6, temperature=1.0, stop_ids=(2,), pad_id=0)
    single = sampler.sample(graphdef, params, prompts, mask, jax.random.key(4),
                            sampler.SampleSpec(**settings))
    for axes in ({"data": 8, "fsdp": 1, "tensor": 1}, {"data": 2, "fsdp": 2, "tensor": 2}):
      mesh = sharding.make_mesh(axes)
      placed = jax.device_put(params, sharding.state_shardings(params, mesh))
      with jax.set_mesh(mesh):
        out = sampler.sample(graphdef, placed, *sharding.shard_batch((prompts, mask), mesh),
                             jax.random.key(4), sampler.SampleSpec(**settings))
      shards = sharding.batch_shards(mesh)
      for name in ("tokens", "logprobs", "mask", "finished"):
        x = getattr(out, name)
        rows = {s.data.shape[0] for s in x.addressable_shards}
        assert rows == {16 // shards}, (axes, name, rows)   # B / (data * fsdp) per device
        index = {s.index[0].start for s in x.addressable_shards}
        assert len(index) == shards, (axes, name, index)
      np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(single.tokens))
      np.testing.assert_array_equal(np.asarray(out.mask), np.asarray(single.mask))
      np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(single.logprobs),
                                 atol=1e-5)
      # Blocked attention over the generated cache: its branch index is one scalar for
      # all shards, and the samples stay those of one device.
      with jax.set_mesh(mesh):
        blocked = sampler.sample(graphdef, placed, *sharding.shard_batch((prompts, mask), mesh),
                                 jax.random.key(4), sampler.SampleSpec(decode_block=2, **settings))
      np.testing.assert_array_equal(np.asarray(blocked.tokens), np.asarray(single.tokens))
    # The decode cache is split too: per device, the compiled call's temporaries (the
    # cache and loop state) shrink with the data-parallel width.
    def temp_bytes(mesh):
      placed = jax.device_put(params, sharding.state_shardings(params, mesh))
      with jax.set_mesh(mesh):
        batch = sharding.shard_batch((big, np.ones_like(big, bool)), mesh)
        long_spec = sampler.SampleSpec(**dict(settings, max_new_tokens=256))
        compiled = sampler.sample.lower(graphdef, placed, *batch, jax.random.key(4),
                                        long_spec).compile()
      return compiled.memory_analysis().temp_size_in_bytes
    big = rng.integers(3, 24, size=(64, 5)).astype(np.int32)
    one = temp_bytes(sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, jax.devices()[:1]))
    eight = temp_bytes(sharding.make_mesh({"data": 8, "fsdp": 1, "tensor": 1}))
    cache_bytes = 2 * cfg.num_layers * 128 * 256 * cfg.num_kv_heads * cfg.head_dim * 4
    assert one > cache_bytes > 4 * eight, (one, eight, cache_bytes)
    print("ok", one, eight)
  """
  assert "ok" in on_8_devices(code)


def _model():
  cfg = ModelConfig(vocab_size=24, num_layers=1, embed_dim=16, num_heads=2, num_kv_heads=1,
                    head_dim=8, mlp_dim=32)
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(1)))


class _Tokenizer:
  eos_ids, pad_id = (2,), 0

  def decode(self, ids):
    return " ".join(map(str, ids))


def _five_problems():
  """Five problems and their prompts of 2 to 4 random tokens."""
  problems = [tasks.Problem(prompt=f"q{i}", answer="0") for i in range(5)]
  rng = np.random.default_rng(4)
  book = prompts.PromptBook({p: tuple(rng.integers(3, 24, size=2 + i % 3)) for i, p in
                             enumerate(problems)}, pad_id=0, max_len=16)
  return problems, book


@pytest.mark.parametrize("decode_slots, decode_slots_min", [(0, 0)] + [
    pytest.param(*slots, marks=pytest.mark.slow("one compiled sampler per slot setting"))
    for slots in ((3, 0), (4, 2))])
def test_calls_of_max_rollouts_cover_every_problem_in_order(decode_slots, decode_slots_min):
  """5 problems x 2 rollouts in calls of at most 4 rollouts: three calls of 2 problems
  (the last padded by repetition), call c drawing with fold_in(rng, c) (call 0 with rng
  itself, so a one-call step draws as before); the padded rollouts are dropped. With
  sampling.decode_slots, each call decodes in that many continuous-batching slots (halved
  down to sampling.decode_slots_min)."""
  graphdef, params = _model()
  problems, book = _five_problems()
  sampling = config_lib.base_config().sampling
  sampling.update(max_new_tokens=6, temperature=1.0, max_rollouts_per_call=4,
                  decode_slots=decode_slots, decode_slots_min=decode_slots_min)
  key = jax.random.key(9)
  got = rollout.sample(graphdef, params, _Tokenizer(), book, problems,
                       tasks.PerItemVerifier(lambda text, p: 0.0), n=2, rng=key,
                       sampling=sampling).result()
  tokens_GP, mask_GP = book.batch(problems)
  expected = []
  for call, rows in enumerate(([0, 1], [2, 3], [4, 4])):
    out = sampler.sample(graphdef, params, tokens_GP[rows], mask_GP[rows],
                         jax.random.fold_in(key, call) if call else key,
                             sampler.SampleSpec(n=2, num_slots=decode_slots,
                                                min_slots=decode_slots_min, **SETTINGS))
    expected.append(np.asarray(out.tokens))
  np.testing.assert_array_equal(got.rollouts.tokens, np.concatenate(expected)[:10])
  assert got.rewards_GN.shape == (5, 2)


def test_unequal_groups_in_calls_of_max_rollouts_keep_each_problems_rollouts():
  """5 problems with 3, 1, 2, 2 and 2 rollouts (n = 2 on average) in calls of at most 4
  rollouts: calls of problems (0, 1), (2, 3) and (4, 4 padded with n = 2), each call's
  group_B from its sizes; the padding's rollouts are dropped and the rewards padded to
  n_max = 3 with 0."""
  graphdef, params = _model()
  problems, book = _five_problems()
  sampling = config_lib.base_config().sampling
  sampling.update(max_new_tokens=6, temperature=1.0, max_rollouts_per_call=4)
  sizes = np.array([3, 1, 2, 2, 2])
  key = jax.random.key(9)
  got = rollout.sample(graphdef, params, _Tokenizer(), book, problems,
                       tasks.PerItemVerifier(lambda text, p: float(len(text) % 2)), n=2,
                       rng=key, sampling=sampling, group_sizes=sizes, n_max=3).result()
  tokens_GP, mask_GP = book.batch(problems)
  expected = []
  for call, (rows, call_sizes) in enumerate((([0, 1], (3, 1)), ([2, 3], (2, 2)),
                                             ([4, 4], (2, 2)))):
    out = sampler.sample(graphdef, params, tokens_GP[rows], mask_GP[rows],
                         jax.random.fold_in(key, call) if call else key,
                         sampler.SampleSpec(n=3, **SETTINGS),
                         sampler.group_index(call_sizes, 3))
    expected.append(np.asarray(out.tokens))
  np.testing.assert_array_equal(got.rollouts.tokens, np.concatenate(expected)[:10])
  np.testing.assert_array_equal(got.owner_B, [0, 0, 0, 1, 2, 2, 3, 3, 4, 4])
  graded = [float(len(_Tokenizer().decode(row)) % 2) for row in got.rollouts.tokens]
  np.testing.assert_array_equal(got.rewards_B, graded)
  assert got.rewards_GN.shape == (5, 3) and got.rewards_GN[1, 1:].sum() == 0
  with pytest.raises(ValueError, match="group sizes sum to 11 rollouts: expected 5 "
                                       "problems x 2"):
    rollout.sample(graphdef, params, _Tokenizer(), book, problems,
                   tasks.PerItemVerifier(lambda text, p: 0.0), n=2, rng=key,
                   sampling=sampling, group_sizes=np.array([3, 2, 2, 2, 2]), n_max=3)


def test_bfloat16_sampling_weights_round_the_weights():
  """weights_dtype=bfloat16 samples greedily exactly what float32 does with weights
  rounded to bfloat16 beforehand."""
  graphdef, params = _model()
  rounded = jax.tree.map(lambda x: x.astype("bfloat16").astype("float32"), params)
  prompts = np.random.default_rng(3).integers(3, 24, size=(4, 4)).astype(np.int32)
  mask = np.ones_like(prompts, bool)
  greedy = dict(SETTINGS, temperature=0.0)
  a = sampler.sample(graphdef, params, prompts, mask, jax.random.key(0),
      sampler.SampleSpec(n=1, weights_dtype="bfloat16", **greedy))
  b = sampler.sample(graphdef, rounded, prompts, mask, jax.random.key(0),
                     sampler.SampleSpec(n=1, **greedy))
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


def test_a_bfloat16_model_samples_from_bfloat16_weights_unless_told_otherwise():
  """Under bfloat16 activations the default (`weights_dtype` None) samples greedily
  exactly what an explicit bfloat16 cast does, and weights_dtype=float32 keeps them as
  stored; under float32 activations the default is as stored. The cast is
  `settings.cast_weights_dtype`'s rule."""
  graphdef, params = _model()
  bf16_graphdef = nnx.graphdef(nnx.merge(graphdef, params).with_dtype("bfloat16"))
  prompts = np.random.default_rng(5).integers(3, 24, size=(4, 4)).astype(np.int32)
  mask = np.ones_like(prompts, bool)
  greedy = dict(SETTINGS, temperature=0.0)
  run = lambda g, p, **kw: np.asarray(sampler.sample(
      g, p, prompts, mask, jax.random.key(0), sampler.SampleSpec(n=1, **greedy, **kw)).logprobs)
  rounded = jax.tree.map(lambda x: x.astype("bfloat16").astype("float32"), params)
  np.testing.assert_array_equal(run(bf16_graphdef, params),
                                run(bf16_graphdef, params, weights_dtype="bfloat16"))
  # The same products (each exact in float32), summed in another order.
  np.testing.assert_allclose(run(bf16_graphdef, params),
                             run(bf16_graphdef, rounded, weights_dtype="float32"), rtol=1e-6)
  assert not np.array_equal(run(bf16_graphdef, params),
                            run(bf16_graphdef, params, weights_dtype="float32"))
  np.testing.assert_array_equal(run(graphdef, params),
                                run(graphdef, params, weights_dtype="float32"))
  assert sampling_settings.cast_weights_dtype("", "bfloat16") == "bfloat16"
  assert sampling_settings.cast_weights_dtype("", "float32") is None
  assert sampling_settings.cast_weights_dtype("float32", "bfloat16") == "float32"


@pytest.mark.parametrize("problems,n,limit,shards", [
    (16, 4, 0, 1), (16, 4, 16, 1), (10, 4, 16, 1), (10, 4, 0, 8), (16, 4, 40, 2),
    (3, 2, 0, 4), (100, 8, 64, 8), (1, 16, 16, 1)])
def test_call_plan_covers_problems_within_the_limit(problems, n, limit, shards):
  per_call, calls = rollout.call_plan(problems, n, limit, shards)
  # brute force: the largest multiple of `shards` problems within the limit, no more
  # than the problems (rounded up to whole shards) need
  candidates = [g for g in range(shards, problems + shards, shards)
                if not limit or g * n <= limit]
  assert per_call == max(candidates)
  assert calls == -(-problems // per_call)
  assert per_call % shards == 0 and (not limit or per_call * n <= limit)


def test_call_plan_rejects_a_limit_below_one_problem_per_device():
  with pytest.raises(ValueError, match="max_rollouts_per_call=16 cannot hold 8 problem"):
    rollout.call_plan(64, 4, 16, 8)


@pytest.mark.slow("compiles continuous batching for eight fake devices, in a subprocess")
def test_continuous_batching_on_a_mesh_equals_lockstep_greedy(on_8_devices):
  """Each data-parallel shard runs its own slots and queue over its own groups."""
  code = """
    import jax, numpy as np
    from flax import nnx
    from isojax.models import sharding
    from isojax.models.transformer import ModelConfig, Transformer
    from isojax.sampling import sampler
    cfg = ModelConfig(vocab_size=24, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=48, qkv_bias=True)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    params = jax.tree.map(lambda x: x * 8 if x.ndim == 3 else x, params)  # peaked logits
    rng = np.random.default_rng(1)
    prompts = rng.integers(3, 24, size=(16, 5)).astype(np.int32)
    mask = np.ones_like(prompts, bool); mask[::3, :2] = False
    settings = dict(n=2, max_new_tokens=10, temperature=0.0, stop_ids=(5, 9, 17), pad_id=0)
    single = sampler.sample(graphdef, params, prompts, mask, jax.random.key(4),
                            sampler.SampleSpec(**settings))
    lengths = np.asarray(single.mask).sum(-1)
    assert len(set(lengths.tolist())) > 2, lengths
    for axes in ({"data": 8, "fsdp": 1, "tensor": 1}, {"data": 2, "fsdp": 2, "tensor": 2}):
      mesh = sharding.make_mesh(axes)
      placed = jax.device_put(params, sharding.state_shardings(params, mesh))
      for min_slots in (0, 2):   # 2: each shard's slots halve down to 1 (data=2: 4, 2, 1)
        with jax.set_mesh(mesh):
          out = sampler.sample(graphdef, placed, *sharding.shard_batch((prompts, mask), mesh),
                               jax.random.key(4),
                               sampler.SampleSpec(num_slots=8, min_slots=min_slots, **settings))
        for name in ("tokens", "mask", "finished"):
          np.testing.assert_array_equal(np.asarray(getattr(out, name)),
                                        np.asarray(getattr(single, name)), err_msg=name)
        np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(single.logprobs),
                                   atol=2e-5)
      rows = {s.data.shape[0] for s in out.tokens.addressable_shards}
      assert rows == {32 // sharding.batch_shards(mesh)}, (axes, rows)
    # On a data-parallel mesh the slot state, queues, prompt-cache gathers and the
    # compaction (4 devices x 2 slots halving to 1) stay on each device: nothing is gathered.
    mesh = sharding.make_mesh({"data": 4, "fsdp": 1, "tensor": 1}, jax.devices()[:4])
    placed = jax.device_put(params, sharding.state_shardings(params, mesh))
    with jax.set_mesh(mesh):
      batch = sharding.shard_batch((prompts, mask), mesh)
      out = sampler.sample(graphdef, placed, *batch, jax.random.key(4),
                           sampler.SampleSpec(num_slots=8, min_slots=4, **settings))
      spec = sampler.SampleSpec(num_slots=8, min_slots=4, **settings)
      hlo = sampler.sample.lower(graphdef, placed, *batch, jax.random.key(4),
                                 spec).compile().as_text()
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(single.tokens))
    assert "all-gather" not in hlo and "all-to-all" not in hlo
    print("ok")
  """
  assert "ok" in on_8_devices(code)


def test_decoding_and_grading_run_on_the_host_thread():
  """`rollout.sample` returns while the verifier is still grading (it blocks on an event
  here), so the caller can dispatch device work first; the result has the rewards."""
  graphdef, params = _model()
  problems = [tasks.Problem(prompt=f"q{i}", answer=str(i)) for i in range(3)]
  book = prompts.PromptBook({p: (3 + i, 4) for i, p in enumerate(problems)}, pad_id=0,
                            max_len=4)
  release, seen = threading.Event(), []

  def reward(text, problem):
    assert release.wait(timeout=60), "grading did not wait for the caller"
    seen.append(threading.current_thread().name)
    return float(problem.answer)
  sampling = config_lib.base_config().sampling
  sampling.update(max_new_tokens=4, temperature=1.0)
  pending = rollout.sample(graphdef, params, _Tokenizer(), book, problems,
                           tasks.PerItemVerifier(reward), n=2, rng=jax.random.key(0),
                           sampling=sampling)
  assert not pending.graded.done()   # returned before grading finished
  release.set()
  scored = pending.result()
  np.testing.assert_array_equal(scored.rewards_GN, [[0, 0], [1, 1], [2, 2]])
  assert scored.completions == [_Tokenizer().decode(row) for row in scored.rollouts.tokens]
  assert seen and threading.main_thread().name not in seen
  assert scored.timings["grade_wait_s"] >= 0 and scored.timings["decode_s"] >= 0
