"""Sharded execution on 8 fake CPU devices matches one device.

Each test runs a child Python with XLA_FLAGS set before JAX starts (the flag cannot
be changed inside a running process): the `on_8_devices` fixture of conftest.py.
"""

import pytest


@pytest.mark.slow("the model and update compiled for 8 fake devices in a child process")
def test_sharded_model_and_update_match_single_device(on_8_devices):
  out = on_8_devices("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    from isojax.models import sharding
    from isojax.models.transformer import ModelConfig, Transformer
    from isojax.rl import update
    assert jax.device_count() == 8
    cfg = ModelConfig(vocab_size=15, num_layers=2, embed_dim=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=64)
    graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    shardings = sharding.state_shardings(params, mesh)
    sharded = jax.device_put(params, shardings)
    q = sharded["layers"]["attn"]["q_proj"]["kernel"][...]   # stacked: [layers, in, out]
    assert q.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor"), q.sharding.spec
    emb = sharded["embed"]["embedding"][...]   # vocab 15 is not divisible: replicated
    assert emb.sharding.spec == jax.sharding.PartitionSpec(None, "fsdp"), emb.sharding.spec
    rng = np.random.default_rng(0)
    b, p, t = 8, 3, 4
    tokens = rng.integers(1, 15, size=(b, p + t)); mask = np.ones_like(tokens, bool)
    ref = nnx.merge(graphdef, params)(tokens, mask)
    got = nnx.merge(graphdef, sharded)(sharding.shard_batch(jnp.asarray(tokens), mesh),
                                       sharding.shard_batch(jnp.asarray(mask), mesh))
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5)
    settings = update.UpdateSettings(group_size=4, prompt_len=p, temperature=1.0,
        policy_loss="ppo_clip", clip_eps=0.2, clip_eps_high=0.28, cispo_eps_max=4.0,
        aggregation="token_mean", constant_normalizer=4.0, kl_coef=0.1, kl_form="k3",
        entropy_coef=0.0, tis_threshold=2.0, num_minibatches=2, num_epochs=1)
    logp = update.score(graphdef, params, tokens, mask, prompt_len=p, temperature=1.0)
    def batch(): return update.TrainBatch(tokens=jnp.asarray(tokens), mask=jnp.asarray(mask),
        response_mask=jnp.ones((b, t), bool), sampler_logp=logp, old_logp=logp, ref_logp=logp,
        advantages=jnp.asarray(rng.normal(size=b), jnp.float32) * 0 + jnp.arange(b) - 3.5,
        keep_pg=jnp.ones(b, bool), keep_reg=jnp.ones(b, bool), shuffle_rng=jax.random.key(1))
    tx = optax.adam(1e-2)
    own = jax.tree.map(jnp.copy, params)  # train_step donates its parameters
    p1, _, s1 = update.train_step(graphdef, own, tx.init(own), batch(), tx=tx, settings=settings)
    sb = sharding.shard_batch(batch().replace(shuffle_rng=None), mesh).replace(shuffle_rng=jax.random.key(1))
    p2, _, s2 = update.train_step(graphdef, sharded, tx.init(sharded), sb, tx=tx, settings=settings)
    for a, c in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(c), atol=2e-5)
    assert jax.tree.leaves(p2)[0].sharding.spec == jax.tree.leaves(shardings)[0].spec
    print("ok", float(s1["loss"]), float(s2["loss"]))
  """)
  assert out.startswith("ok")


@pytest.mark.slow("a run compiled for 8 fake devices in a child process")
def test_main_runs_on_a_three_axis_mesh(tmp_path, on_8_devices):
  out = on_8_devices(f"""
    import json
    from isojax import run_dir
    from isojax.configs import hard
    from isojax.run import train
    config = hard.get_config("micro")
    config.mesh.update(data=-1, fsdp=2, tensor=2)
    config.num_steps = 2
    train.run(config, "{tmp_path}/run")
    lines = run_dir.read_metrics("{tmp_path}/run")
    print("ok", [l["rollouts"] for l in lines])
  """)
  assert out.strip() == "ok [0, 16, 32]"


def test_checkpoint_fingerprint_does_not_depend_on_sharding(on_8_devices):
  out = on_8_devices("""
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from isojax.run import checkpointing
    mesh = jax.make_mesh((4, 2), ("a", "b"))
    tree = {"w": jnp.asarray(np.random.default_rng(0).normal(size=(16, 8)), jnp.float32),
            "v": jnp.arange(8, dtype=jnp.bfloat16)}
    sharded = {"w": jax.device_put(tree["w"], NamedSharding(mesh, P("a", "b"))),
               "v": jax.device_put(tree["v"], NamedSharding(mesh, P("a")))}
    print("ok", checkpointing.fingerprint(tree) == checkpointing.fingerprint(sharded))
  """)
  assert out.strip() == "ok True"
