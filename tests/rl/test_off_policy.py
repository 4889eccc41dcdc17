"""Off-policy generation (rl.max_staleness): the schedule, the generator, the loop
against a reference that keeps old parameter versions, resume after SIGKILL, and the
ratio taken against the sampler's log-probs."""

import importlib
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from isojax import run_dir
from isojax.config import config_lib
from isojax.models import sharding
from isojax.rl import off_policy, rollout, sources, update
from isojax.sampling import sampler
from isojax.run import train



def test_a_snapshot_is_a_copy_cast_once_and_placed():
  """`weight_snapshot`: a float32 copy (new buffers, the same values) without a cast,
  every float array in bfloat16 with one (integers kept), then `place` applied."""
  params = {"w": jnp.arange(6, dtype=jnp.float32) / 7, "i": jnp.arange(3)}
  copy = off_policy.weight_snapshot()(params)
  assert copy["w"] is not params["w"] and copy["w"].dtype == jnp.float32
  np.testing.assert_array_equal(copy["w"], params["w"])
  cast = off_policy.weight_snapshot("bfloat16")(params)
  assert cast["w"].dtype == jnp.bfloat16 and cast["i"].dtype == params["i"].dtype
  np.testing.assert_array_equal(np.asarray(cast["w"], np.float32),
                                np.asarray(params["w"].astype(jnp.bfloat16), np.float32))
  placed = off_policy.weight_snapshot("float32", place=lambda p: {"placed": p})(params)
  assert placed["placed"]["w"].dtype == jnp.float32


def test_a_queued_batch_of_unequal_groups_round_trips_through_its_checkpoint_tree():
  """`Generated.to_tree`/`from_tree` keep the group sizes of unequal groups, and count
  the real rollouts (not the padded [G, n_max]); equal groups add no key."""
  rng = np.random.default_rng(0)
  sizes = np.array([2, 5, 3])
  rollouts = sampler.Rollouts(tokens=rng.integers(0, 9, (10, 4)).astype(np.int32),
                              logprobs=rng.normal(size=(10, 4)).astype(np.float32),
                              mask=np.ones((10, 4), bool), finished=np.ones(10, bool),
                              forced=np.zeros((10, 4), bool))
  rewards = np.zeros((3, 5), np.float32)
  rewards[1, :5] = 1.0
  scored = rollout.ScoredRollouts(np.ones((3, 2), np.int32), np.ones((3, 2), bool), rollouts,
                                  rewards, completions=[], group_sizes=sizes)
  generated = off_policy.Generated(4, 2, np.array([7, 1, 3]), scored, active_problems=9)
  assert generated.generated == 10 and generated.oldest_B().tolist() == [2] * 10
  back = off_policy.Generated.from_tree(generated.to_tree())
  np.testing.assert_array_equal(back.scored.group_sizes, sizes)
  np.testing.assert_array_equal(back.scored.rewards_B, scored.rewards_B)
  assert back.generated == 10 and back.step == 4 and back.version == 2
  equal = rollout.ScoredRollouts(np.ones((2, 2), np.int32), np.ones((2, 2), bool), rollouts,
                                 np.zeros((2, 5), np.float32), completions=[])
  tree = off_policy.Generated(0, 0, np.array([0, 1]), equal, active_problems=2).to_tree()
  assert "group_sizes" not in tree
  assert off_policy.Generated.from_tree(tree).scored.group_sizes is None


@pytest.mark.parametrize("k,mode,expected", [
    (0, "pipeline", [0, 1, 2, 3, 4, 5, 6]),
    (2, "pipeline", [0, 0, 0, 1, 2, 3, 4]),
    (1, "pipeline", [0, 0, 1, 2, 3, 4, 5]),
    (3, "ppo_off_policy", [0, 0, 0, 3, 3, 3, 6]),
    (1, "ppo_off_policy", [0, 1, 2, 3, 4, 5, 6]),
])
def test_source_version_follows_scalerl_schedules(k, mode, expected):
  assert [off_policy.source_version(s, k, mode) for s in range(7)] == expected


def _fake_generated(step, version, params):
  scored = rollout.ScoredRollouts(
      np.zeros((2, 3), np.int32), np.ones((2, 3), bool), None,
      np.full((2, 4), float(params["w"].sum()), np.float32), [])
  return off_policy.Generated(step, version, np.arange(2), scored, active_problems=2)


@pytest.mark.parametrize("k,mode", [(2, "pipeline"), (3, "ppo_off_policy")])
def test_generator_samples_each_step_with_its_version_from_a_copy(k, mode):
  calls = []

  def sample_step(step, version, params):
    calls.append((step, version))
    time.sleep(0.01)  # still sampling when the learner moves on
    return _fake_generated(step, version, params)

  num_steps = 7
  gen = off_policy.Generator(sample_step, max_staleness=k, mode=mode, num_steps=num_steps)
  params = {"w": jnp.zeros(3)}
  for step in range(num_steps):
    gen.publish(step, params)
    got, _ = gen.take(step)
    # Sampled by the parameters of its version: version v holds w = v everywhere.
    assert got.version == off_policy.source_version(step, k, mode)
    assert got.scored.rewards_GN[0, 0] == 3 * got.version
    assert 0 <= step - got.version <= k
    params = jax.jit(lambda p: {"w": p["w"] + 1}, donate_argnums=0)(params)  # donated
  gen.close()
  assert [c[0] for c in calls] == list(range(num_steps))  # in step order, each once


def test_generator_resumes_from_its_queue_and_refuses_an_unqueued_step():
  queued = [_fake_generated(s, 0, {"w": jnp.zeros(1)}) for s in (3, 4)]
  calls = []
  gen = off_policy.Generator(lambda s, v, p: calls.append(s) or _fake_generated(s, v, p),
                             max_staleness=2, mode="pipeline", num_steps=6, queued=queued)
  with pytest.raises(RuntimeError, match="step 5 was never queued"):
    gen.take(5)
  gen.publish(3, {"w": jnp.ones(1)})
  assert [g.step for g in gen.queued()] == [3, 4, 5] and calls == [5]
  gen.close()


def test_staleness_metrics_histogram_and_bound():
  g = _fake_generated(5, 3, {"w": jnp.zeros(1)})
  assert off_policy.staleness_metrics(g, 5, 2) == {
      "train/staleness_max": 2, "train/staleness_histogram": [0, 0, 8]}
  with pytest.raises(AssertionError, match="beyond rl.max_staleness=1"):
    off_policy.staleness_metrics(g, 5, 1)


@pytest.mark.parametrize("field,value,message", [
    ("max_staleness", -1, "rl.max_staleness=-1"),
    ("max_staleness", True, "rl.max_staleness=True"),
    ("off_policy", "async", "rl.off_policy='async'"),
])
def test_bad_off_policy_fields_are_named(field, value, message):
  config = _micro(num_steps=2)
  config.rl[field] = value
  with pytest.raises(ValueError, match=message.replace("(", r"\(")):
    config_lib.resolve(config)


def _micro(**overrides):
  config = importlib.import_module("isojax.configs.hard").get_config("micro")
  config.update(overrides)
  config.eval.train_problems = 0
  return config


@pytest.mark.parametrize("k,mode,dtype", [(2, "pipeline", "float32"),
                                          (2, "ppo_off_policy", "float32"),
                                          (2, "pipeline", "bfloat16")])
def test_off_policy_run_equals_a_loop_that_keeps_old_versions(tmp_path, k, mode, dtype,
                                                              run_parts):
  """train.run with rl.max_staleness = k against a plain loop that keeps every
  parameter version and samples step s with version source_version(s). Under bfloat16
  activations the run's generator keeps each version cast to bfloat16 once
  (`off_policy.weight_snapshot`) where the loop keeps float32 copies that each sampler
  call casts: the same samples."""
  config = _micro(num_steps=5)
  config.rl.update(max_staleness=k, off_policy=mode)
  config.model.dtype = dtype
  train.run(config, str(tmp_path / "run"))
  logged = [r for r in run_dir.read_metrics(str(tmp_path / "run")) if r["step"] > 0]

  config, tok, problems, book, verifier, graphdef, learner = run_parts(config)
  sample_key, _, shuffle_key, select_key = jax.random.split(jax.random.key(config.seed), 4)
  versions = [jax.tree.map(jnp.copy, learner.params)]
  n, b_p = config.rollouts_per_problem, config.problems_per_batch
  expected = []
  for step in range(config.num_steps):
    ids = sources.problems_for_step(config.seed, step, len(problems), b_p)
    scored = rollout.generate(graphdef, versions[off_policy.source_version(step, k, mode)],
                              tok, book, [problems[i] for i in ids], verifier, n=n,
                              rng=jax.random.fold_in(sample_key, step),
                              sampling=config.sampling)
    result = learner.step(scored, select_rng=jax.random.fold_in(select_key, step),
                          shuffle_rng=jax.random.fold_in(shuffle_key, step))
    versions.append(jax.tree.map(jnp.copy, learner.params))
    expected.append((float(scored.rewards_GN.mean()), float(result.stats["loss"]),
                     float(result.stats["grad_norm"])))
  assert [(r["train/reward"], r["train/loss"], r["train/grad_norm"]) for r in logged] == expected
  assert [r["train/staleness_max"] for r in logged] == [
      s - off_policy.source_version(s, k, mode) for s in range(config.num_steps)]
  # The ratios are taken against the sampler: nothing is left for truncated IS.
  assert all(r["train/tis/mean_abs_logp_diff"] == 0 for r in logged)


def test_ratio_takes_the_sampler_log_probs_of_a_stale_batch(run_parts):
  """A batch sampled by version 0 trained by version 1: PPO-clip's loss with the ratio
  pi_1 / pi_0 (token mean), against NumPy."""
  config = _micro(num_steps=2)
  config.rl.update(max_staleness=1, kl_coef=0.0, log_kl_to_base=False, tis_threshold=2.0,
                   policy_loss="ppo_clip", aggregation="token_mean", advantage="grpo")
  config, tok, problems, book, verifier, graphdef, learner = run_parts(config)
  v0 = jax.tree.map(jnp.copy, learner.params)
  scored = rollout.generate(graphdef, v0, tok, book, problems[:config.problems_per_batch],
                            verifier, n=config.rollouts_per_problem, rng=jax.random.key(7),
                            sampling=config.sampling)
  assert 0 < scored.rewards_GN.mean() < 1
  # Version 1: every weight moved, so pi_1 differs from pi_0 on every token.
  v1 = jax.tree.map(lambda x: x * 1.2 if jnp.issubdtype(x.dtype, jnp.floating) else x, v0)
  learner.params = jax.tree.map(jnp.copy, v1)
  stats = learner.step(scored, select_rng=jax.random.key(0), shuffle_rng=jax.random.key(1)).stats

  tokens, mask = rollout.sequences(scored, config.rollouts_per_problem)
  logp1 = np.asarray(update.score(graphdef, v1, tokens, mask, prompt_len=scored.prompt_len,
                                  temperature=config.sampling.temperature))
  logp0 = scored.rollouts.logprobs
  valid = scored.rollouts.mask
  r = scored.rewards_GN
  adv = ((r - r.mean(1, keepdims=True)) / (r.std(1, ddof=0, keepdims=True) + 1e-6)).reshape(-1)
  ratio = np.exp(np.where(valid, logp1 - logp0, 0.0))
  eps = config.rl.clip_eps  # ppo_clip: symmetric
  per_token = -np.minimum(ratio * adv[:, None], np.clip(ratio, 1 - eps, 1 + eps) * adv[:, None])
  want = (per_token * valid).sum() / valid.sum()
  assert abs(np.abs(np.log(ratio[valid])).max()) > 0.05  # the batch is really stale
  np.testing.assert_allclose(stats["loss"], want, rtol=2e-4, atol=1e-6)


@pytest.mark.slow("off-policy runs compiled for 8 fake devices in a child process")
def test_sampling_on_devices_of_its_own(on_8_devices):
  """mesh.rollout_fraction = 0.5 on 8 devices: the generator thread samples on the last
  4, evaluation and the update run on the first 4; every step trains B_p * n rollouts
  at most k updates stale."""
  out = on_8_devices("""
    import json, threading
    import jax
    from isojax import run_dir
    from isojax.configs import scalerl
    from isojax.models import sharding
    from isojax.rl import rollout
    from isojax.run import train

    learner, generator = sharding.make_meshes(dict(data=-1, fsdp=1, tensor=1,
                                                   rollout_fraction=0.5))
    ids = lambda mesh: sorted(d.id for d in mesh.devices.flat)
    moved = sharding.on_mesh({"w": jax.device_put(jax.numpy.ones(8), jax.sharding.NamedSharding(
        learner, jax.sharding.PartitionSpec("data")))}, generator)
    placed = sorted(d.id for d in moved["w"].devices())
    calls = []
    original = rollout.sample
    def spy(graphdef, params, *args, **kwargs):
      calls.append((threading.current_thread().name.startswith("isojax-generator"),
                    ids(rollout.params_mesh(params))))
      return original(graphdef, params, *args, **kwargs)
    rollout.sample = spy
    config = scalerl.get_config("micro")
    config.update(num_steps=4)
    config.rl.max_staleness = 2
    config.mesh.rollout_fraction = 0.5
    config.eval.train_problems = 0
    train.run(config, "run")
    lines = [r for r in run_dir.read_metrics("run") if r["step"] > 0]
    print(json.dumps(dict(learner=ids(learner), generator=ids(generator), placed=placed,
                          calls=calls, b=config.problems_per_batch * config.rollouts_per_problem,
                          histograms=[r["train/staleness_histogram"] for r in lines])))
  """)
  got = json.loads(out.strip().splitlines()[-1])
  assert got["learner"] == [0, 1, 2, 3] and got["generator"] == [4, 5, 6, 7]
  assert got["placed"] == [4, 5, 6, 7]
  on_generator = [d for thread, d in got["calls"] if thread]
  on_main = [d for thread, d in got["calls"] if not thread]
  assert len(on_generator) == 4 and all(d == [4, 5, 6, 7] for d in on_generator)
  assert on_main and all(d == [0, 1, 2, 3] for d in on_main)  # evaluation
  assert got["histograms"] == [[got["b"], 0, 0], [0, got["b"], 0], [0, 0, got["b"]],
                               [0, 0, got["b"]]]


def test_placement_errors_are_named():
  config = _micro(num_steps=2)
  config.mesh.rollout_fraction = 0.5
  with pytest.raises(ValueError, match=r"mesh.rollout_fraction=0.5 needs rl.max_staleness"):
    config_lib.resolve(config)
  config.mesh.rollout_fraction = 1.0
  with pytest.raises(ValueError, match=r"mesh.rollout_fraction=1.0: expected in \[0, 1\)"):
    config_lib.resolve(config)
  with pytest.raises(ValueError, match="gives 0 sampling devices"):
    sharding.make_meshes(dict(data=-1, fsdp=1, tensor=1, rollout_fraction=0.4),
                         jax.devices()[:1])


def test_in_flight_generator_drops_and_counts_batches_too_stale():
  """A generator far faster than the learner: its queue fills with batches begun by old
  versions; `take` skips those more than k updates old, counting their rollouts, and
  every batch taken or dropped is handed to `consumed` once, in order."""
  k, consumed = 1, []

  def sample_batch(index, in_flight):
    version, _ = in_flight.weights()
    g = _fake_generated(index, version, {"w": jnp.zeros(1)})
    g.scored.versions_B2 = np.full((8, 2), version)
    return g

  gen = off_policy.InFlightGenerator(sample_batch, max_staleness=k, first_batch=5,
                                     in_flight_tokens=4, consumed=consumed.append)
  trained = []
  for version in range(6):
    gen.publish(version, {"w": jnp.zeros(1)})
    got, _ = gen.take(version)
    assert version - got.oldest_B().min() <= k
    trained.append(got)
    time.sleep(0.05)  # the learner is slow: the generator refills its queue meanwhile
  gen.close()
  assert [g.step for g in consumed] == list(range(5, 5 + len(consumed)))
  dropped = [g for g in consumed if g.step not in {t.step for t in trained}]
  assert dropped and sum(t.dropped for t in trained) == 8 * len(dropped)


def test_in_flight_generator_reraises_the_generator_error():
  def failing(index, in_flight):
    raise ValueError("sampler broke")
  gen = off_policy.InFlightGenerator(failing, max_staleness=1, first_batch=0,
                                     in_flight_tokens=4)
  gen.publish(0, {"w": jnp.zeros(1)})
  with pytest.raises(RuntimeError, match="generator thread failed") as info:
    gen.take(0)
  assert "sampler broke" in str(info.value.__cause__)
  gen.close()


@pytest.mark.slow("an in-flight run compiled for 8 fake devices in a child process")
def test_in_flight_pipeline_on_devices_of_its_own(on_8_devices):
  """rl.off_policy=pipeline_in_flight, 4 devices sampling and 4 learning: no trained
  rollout begun more than k updates before, B_p * n rollouts per step, every dropped
  rollout counted in `rollouts`; a resumed run counts nothing twice."""
  out = on_8_devices("""
    import json, shutil
    from isojax import run_dir
    from isojax.configs import scalerl
    from isojax.run import train
    config = scalerl.get_config("micro")
    config.update(num_steps=8, checkpoint_every=4)
    config.rl.update(max_staleness=2, off_policy="pipeline_in_flight", in_flight_tokens=1)
    config.mesh.rollout_fraction = 0.5
    config.eval.train_problems = 0
    train.run(config, "run")
    first = run_dir.read_metrics("run")
    shutil.rmtree("run/checkpoints/8")
    train.run(config, "run")
    print(json.dumps(dict(first=first, resumed=run_dir.read_metrics("run"),
                          b=config.problems_per_batch * config.rollouts_per_problem)))
  """)
  got = json.loads(out.strip().splitlines()[-1])
  b = got["b"]
  for lines in (got["first"], got["resumed"]):
    steps = [r for r in lines if r["step"] > 0]
    assert [r["step"] for r in steps] == list(range(1, 9))
    assert all(sum(r["train/staleness_histogram"]) == b for r in steps)
    assert all(len(r["train/staleness_histogram"]) == 3 for r in steps)  # 0..k
    assert all(r["train/staleness_max"] <= 2 for r in steps)
    # Cumulative rollouts: each trained batch and each dropped rollout, once.
    total = 0
    for r in steps:
      total += b + r["train/dropped_rollouts"]
      assert r["rollouts"] == total
  # The lines up to the checkpoint at step 4 are kept as they were.
  assert got["resumed"][:5] == got["first"][:5]


def test_scalerl_sync_variant_is_the_recipe_with_synchronous_generation():
  from isojax.configs import scalerl  # pylint: disable=import-outside-toplevel
  for preset in ("", "micro"):
    full = scalerl.get_config(preset or None).to_dict()
    sync = scalerl.get_config(f"{preset},sync" if preset else "sync").to_dict()
    assert full["rl"].pop("max_staleness") == 8 and sync["rl"].pop("max_staleness") == 0
    assert full == sync
  with pytest.raises(ValueError, match="at most one preset"):
    scalerl.get_config("micro,paper")
