"""launch.aot: one step compiled for 8 fake CPU devices, its byte counts and its refusals.

The compiling tests run a child Python: the fake device count must be set before JAX
starts (`topology.prepare_backend` sets it), and this process already has its one device.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import pytest

from isojax import aot, topology
from isojax.config import config_lib
from isojax.configs import hard

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A Qwen2-shaped model (qkv bias, untied head) small enough to count by hand.
L, D, N, K, H, F, V = 2, 64, 4, 2, 16, 128, 96
HF = dict(model_type="qwen2", num_hidden_layers=L, hidden_size=D, num_attention_heads=N,
          num_key_value_heads=K, head_dim=H, intermediate_size=F, vocab_size=V,
          tie_word_embeddings=False)
B, P, T = 16, 16, 8  # micro preset: 4 problems x 4 rollouts, 8 new tokens; --prompt_len=16
FSDP = 8


def _param_bytes_per_chip() -> int:
  """float32 parameters on one of 8 fsdp shards: `embed` axes split, the rest whole."""
  on_embed = 2 * V * D + L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F)
  whole = L * (N * H + 2 * K * H + 2 * D) + D  # qkv biases, two norms per layer; final norm
  return 4 * (on_embed // FSDP + whole)


@pytest.fixture
def model_dir(tmp_path):
  with open(tmp_path / "config.json", "w") as f:
    json.dump(HF, f)
  return str(tmp_path)


def _micro(model_dir: str):
  config = hard.get_config("micro")
  config.base_model.path = model_dir
  config.mesh.update(data=1, fsdp=-1, tensor=1)
  return config


def _child_json(code: str):
  """Runs `code` in a child Python (its own fake devices) and returns the JSON of its
  last printed line, failing the test with its stderr if it exits non-zero."""
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow("compiles every program of a step for eight fake devices")
def test_cpu8_compiles_every_program_with_hand_counted_arguments(model_dir):
  code = f"""
    import dataclasses, json
    from isojax import aot, topology
    from isojax.config import config_lib
    from isojax.configs import hard
    topology.prepare_backend("cpu:8")
    config = hard.get_config("micro")
    config.base_model.path = {model_dir!r}
    config.mesh.update(data=1, fsdp=-1, tensor=1)
    s = config_lib.settings(config_lib.resolve(config))
    results = aot.check(s, topology.devices("cpu:8"), aot.model_config(s), 16)
    print(json.dumps([dataclasses.asdict(r) for r in results]))
  """
  printed = _child_json(code)
  got = {r["name"]: r for r in printed}
  assert list(got) == ["sample", "score", "train_step"]
  assert not any(r["error"] for r in got.values())
  params = _param_bytes_per_chip()
  opt = 2 * params + 2 * 4  # Adam's two moments beside the parameters; two int32 step counts
  # score: parameters and the [B, P + T] int32 tokens and bool mask, split over 8 chips.
  assert got["score"]["argument"] == params + B * (P + T) * (4 + 1) // FSDP
  # train_step: parameters and Adam state sharded like them (replicated they would be
  # 8x larger), plus at most the batch rows of this chip (jit drops unused fields).
  batch = B // FSDP * ((P + T) * 5 + T * (1 + 3 * 4) + 4 + 2) + 8
  assert 0 <= got["train_step"]["argument"] - params - opt <= batch
  # The micro preset logs KL to the base model: a reference copy stays resident.
  assert got["train_step"]["resident"] == params
  assert got["sample"]["resident"] == got["score"]["resident"] == opt + params


@pytest.mark.slow("compiles the sampler ahead of time for several settings")
def test_sampler_is_compiled_with_the_configured_slots_and_dtype(model_dir):
  """The sampler program is the one `rollout.sample` runs: with sampling.decode_slots its
  decode cache holds the slots' rows, not one row per rollout; with
  sampling.dtype=bfloat16 (a float32 model) it holds them in bfloat16."""
  code = f"""
    import dataclasses, json
    from isojax import aot, topology
    from isojax.config import config_lib
    from isojax.configs import hard
    topology.prepare_backend("cpu:8")
    # Only the sampler is looked at: its programs are compiled, score's and the update's
    # (which the other tests here count) are not.
    aot._update_programs = lambda *args, **kwargs: []
    out = []
    for slots, fewest, weights, dtype in ((0, 0, "", ""), (8, 0, "", ""), (8, 1, "", ""),
                                          (0, 0, "bfloat16", ""),
                                          (0, 0, "bfloat16", "bfloat16")):
      config = hard.get_config("micro")
      config.base_model.path = {model_dir!r}
      config.mesh.update(data=1, fsdp=-1, tensor=1)
      config.sampling.max_new_tokens = 512   # the decode cache dominates the temporaries
      config.sampling.update(decode_slots=slots, decode_slots_min=fewest,
                             weights_dtype=weights, dtype=dtype)
      s = config_lib.settings(config_lib.resolve(config))
      sample = aot.check(s, topology.devices("cpu:8"), aot.model_config(s), 16)[0]
      out.append(dataclasses.asdict(sample))
    print(json.dumps(out))
  """
  printed = _child_json(code)
  lockstep, slots, halving, bf16_weights, bf16 = printed
  assert "decode slots" not in lockstep["inputs"] and "caches" not in lockstep["inputs"]
  assert bf16["inputs"].endswith(" x 4 rollouts of 512 tokens, bfloat16 activations and caches")
  assert slots["inputs"].endswith(", 8 decode slots")
  assert halving["inputs"].endswith(", 8 decode slots halving down to 8")
  # 16 rollouts in 8 slots: the [L, rows, 512, K, H] caches of k and v shrink by half a
  # lockstep cache (per chip: the rows are split over the 8 devices).
  cache = 2 * HF["num_hidden_layers"] * 512 * HF["num_key_value_heads"] * (
      HF["hidden_size"] // HF["num_attention_heads"]) * 4 * (16 - 8) // 8
  assert lockstep["temp"] - slots["temp"] >= 0.9 * cache, (lockstep["temp"], slots["temp"])
  # With bfloat16 weights either way, bfloat16 activations take half the 16 rows' caches
  # (16 rows = 2 x (16 - 8), so `cache` bytes). The peak temporaries shrink by more than
  # half of that (0.83 of it when this test was written: XLA:CPU upcasts the attended
  # layer's bfloat16 cache to float32 for its dots), which float32 caches could
  # not give: at 2 rows per chip the other activations are a few KiB, and the float32
  # copies of the bfloat16 weights that float32 projections make about 40 KiB.
  assert bf16_weights["temp"] - bf16["temp"] >= 0.5 * cache, (bf16_weights["temp"], bf16["temp"])


@pytest.mark.slow("compiles a step for 8 fake devices")
def test_too_small_hbm_fails_naming_programs_and_fields(model_dir):
  proc = subprocess.run(
      [sys.executable, "-m", "launch.aot", "--config=configs/hard.py:micro", "--topology=cpu:8",
       f"--config.base_model.path={model_dir}", "--config.mesh.data=1", "--config.mesh.fsdp=-1",
       "--prompt_len=16", "--hbm_gib=0.0001"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert proc.returncode != 0
  assert "does not fit" in proc.stderr, proc.stderr[-3000:]
  for name in ("sample:", "score:", "train_step:"):
    assert name in proc.stderr
  assert "rl.micro_batch_size" in proc.stderr and "model.remat" in proc.stderr
  assert "train_step" in proc.stdout and "HBM 0.10" in proc.stdout  # the table, in MiB


def _settings(config):
  return config_lib.settings(config_lib.resolve(config))


def test_bad_inputs_fail_before_compiling(model_dir):
  with pytest.raises(ValueError, match=r"--topology='v9-1024'.*v5p-64"):
    topology.devices("v9-1024")
  with pytest.raises(ValueError, match="cpu:N"):
    topology.devices("cpu:many")
  with pytest.raises(ValueError, match="xla_force_host_platform_device_count=4096"):
    topology.devices("cpu:4096")
  with pytest.raises(ValueError, match=r"--model='llama-9b'.*qwen2.5-7b"):
    aot.model_config(_settings(_micro(model_dir)), "llama-9b")
  config = _micro(model_dir)
  config.base_model.path = model_dir + "/missing"
  s = _settings(config)
  with pytest.raises(ValueError, match=r"missing'?: no such file or directory"):
    aot.model_config(s)
  config = _micro(model_dir)
  config.mesh.update(data=3, fsdp=1, tensor=1)
  s = _settings(config)
  with pytest.raises(ValueError, match="uses 3 devices"):
    aot.check(s, topology.devices("cpu:1"), aot.model_config(s), 16)


def test_known_models_have_their_published_sizes():
  import math  # pylint: disable=g-import-not-at-top
  from isojax.models import transformer  # pylint: disable=g-import-not-at-top
  cfg = aot.model_config(_settings(hard.get_config("paper")), "qwen2.5-7b")
  assert (cfg.num_layers, cfg.embed_dim, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
          cfg.mlp_dim, cfg.vocab_size) == (28, 3584, 28, 4, 128, 18944, 152064)
  assert cfg.qkv_bias and not cfg.tie_embeddings and cfg.rope_theta == 1e6
  sizes = [math.prod(x.shape) for x in jax.tree.leaves(transformer.abstract_model(cfg))]
  assert sum(sizes) == 7_615_616_512  # Qwen2.5-7B's model card: 7.61B
  assert aot.model_config(_settings(hard.get_config("paper")), "qwen2.5-1.5b").tie_embeddings


@pytest.mark.slow("compiles every program of a step for eight fake devices")
def test_cpu8_split_compiles_the_sampler_and_the_learner_on_their_own_chips(model_dir):
  """mesh.rollout_fraction = 0.5: the sampler on 4 data-parallel chips holds whole
  weights and nothing else; score and train_step on 4 fsdp chips hold quarters."""
  code = f"""
    import dataclasses, json
    from isojax import aot, topology
    from isojax.config import config_lib
    from isojax.configs import hard
    topology.prepare_backend("cpu:8")
    config = hard.get_config("micro")
    config.base_model.path = {model_dir!r}
    config.mesh.update(data=1, fsdp=-1, tensor=1, rollout_fraction=0.5)
    config.rl.max_staleness = 2
    s = config_lib.settings(config_lib.resolve(config))
    results = aot.check(s, topology.devices("cpu:8"), aot.model_config(s), 16)
    print(json.dumps([dataclasses.asdict(r) for r in results]))
  """
  printed = _child_json(code)
  got = {r["name"]: r for r in printed}
  assert not any(r["error"] for r in got.values())
  on_embed = 2 * V * D + L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F)
  whole = L * (N * H + 2 * K * H + 2 * D) + D
  params4 = 4 * (on_embed // 4 + whole)            # one of 4 fsdp shards
  full = 4 * (on_embed + whole)                    # replicated on each sampling chip
  # sample: whole weights, its prompts [4 groups split over 4 chips] and the key.
  assert full <= got["sample"]["argument"] <= full + 4 // 4 * P * 5 + 16
  assert got["sample"]["resident"] == 0
  assert got["score"]["argument"] == params4 + B * (P + T) * (4 + 1) // 4
  assert got["train_step"]["resident"] == params4   # the reference copy only
  assert "on the 4 sampling chips" in got["sample"]["inputs"]
  assert "on the 4 learner chips" in got["train_step"]["inputs"]


@pytest.mark.slow("compiles every program of a PPO step for eight fake devices")
def test_cpu8_ppo_compiles_the_critic_with_hand_counted_bytes_and_flops(model_dir):
  """rl.advantage=gae: values and critic_step are compiled on the learner's chips; the
  critic (the policy's decoder without its LM head, plus a D -> 1 head) and its Adam
  state stay resident in the policy's programs, the policy's state in the critic's.
  With critic.train_trunk=False Adam holds the head's moments only, replicated."""
  code = f"""
    import dataclasses, json
    from isojax import aot, topology
    from isojax.config import config_lib
    from isojax.configs import hard
    topology.prepare_backend("cpu:8")
    out = []
    for train_trunk, trunk in ((True, "own"), (False, "own"), (False, "policy")):
      config = hard.get_config("micro")
      config.base_model.path = {model_dir!r}
      config.mesh.update(data=1, fsdp=-1, tensor=1)
      config.rl.advantage = "gae"
      config.critic.update(train_trunk=train_trunk, trunk=trunk)
      s = config_lib.settings(config_lib.resolve(config))
      results = aot.check(s, topology.devices("cpu:8"), aot.model_config(s), 16)
      out.append([dataclasses.asdict(r) for r in results])
    print(json.dumps(out))
  """
  printed = _child_json(code)
  trained, frozen, shared = [{r["name"]: r for r in run}
                             for run in printed]
  assert list(trained) == ["sample", "score", "train_step", "values", "critic_step"]
  assert not any(r["error"] for r in [*trained.values(), *frozen.values()])
  config = hard.get_config("micro")
  epochs = config.rl.num_epochs
  params = _param_bytes_per_chip()
  opt = 2 * params + 2 * 4
  # The critic: no LM head (V x D on the embed axis); a [D, 1] kernel split over the
  # embed axis and a replicated bias.
  critic = params - 4 * V * D // FSDP + 4 * (D // FSDP + 1)
  critic_opt = 2 * critic + 2 * 4
  head_opt = 2 * 4 * (D + 1) + 2 * 4
  assert trained["score"]["resident"] == opt + params + critic + critic_opt
  assert trained["train_step"]["resident"] == params + critic + critic_opt
  assert frozen["train_step"]["resident"] == params + critic + head_opt
  assert trained["values"]["resident"] == trained["critic_step"]["resident"] == (
      params + opt + params)  # the policy, its Adam state, the reference copy
  assert trained["values"]["argument"] == critic + B * (P + T) * (4 + 1) // FSDP
  assert 0 <= trained["critic_step"]["argument"] - critic - critic_opt <= (
      B // FSDP * ((P + T) * 5 + T * (1 + 2 * 4)) + 8)
  assert 0 <= frozen["critic_step"]["argument"] - critic - head_opt <= (
      B // FSDP * ((P + T) * 5 + T * (1 + 2 * 4)) + 8)
  # FLOPs: weights every token meets (layers, norms, biases; the critic's head too).
  layers = L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
                + N * H + 2 * K * H + 2 * D) + D
  critic_body = layers + D + 1
  assert trained["values"]["flops"] == 2 * critic_body * B * (P + T)
  assert trained["critic_step"]["flops"] == 6 * epochs * critic_body * B * (P + T)
  assert frozen["critic_step"]["flops"] == 2 * epochs * critic_body * B * (P + T)
  assert trained["train_step"]["flops"] == 6 * epochs * (layers * B * (P + T) + V * D * B * T)
  assert "trunk frozen" in frozen["critic_step"]["inputs"]
  # critic.trunk='policy': the critic holds its head alone; the policy's weights (without
  # the LM head) are an argument of its programs, not a second resident copy.
  head = 4 * (D // FSDP + 1)
  assert shared["train_step"]["resident"] == params + head + head_opt
  assert shared["values"]["argument"] == (head + params - 4 * V * D // FSDP
                                          + B * (P + T) * (4 + 1) // FSDP)
  assert shared["critic_step"]["flops"] == frozen["critic_step"]["flops"]
  assert "trunk the policy's" in shared["critic_step"]["inputs"]


@pytest.mark.slow("compiles every program of a LoRA step for eight fake devices")
def test_cpu8_lora_trains_and_holds_only_the_adapters(model_dir):
  """model.lora.rank = 4: Adam's state is the adapters' (hand-counted), the reference
  policy is the base itself (zero adapters, not a second copy), and the update reads the
  base weights as an argument without differentiating them (4 FLOPs per weight)."""
  code = f"""
    import dataclasses, json
    from isojax import aot, topology
    from isojax.config import config_lib
    from isojax.configs import hard
    topology.prepare_backend("cpu:8")
    config = hard.get_config("micro")
    config.base_model.path = {model_dir!r}
    config.mesh.update(data=1, fsdp=-1, tensor=1)
    config.model.lora.rank = 4
    s = config_lib.settings(config_lib.resolve(config))
    results = aot.check(s, topology.devices("cpu:8"), aot.model_config(s), 16)
    print(json.dumps([dataclasses.asdict(r) for r in results]))
  """
  printed = _child_json(code)
  got = {r["name"]: r for r in printed}
  assert not any(r["error"] for r in got.values())
  r = 4
  # Per layer and projection, A [in, r] split on its first axis when that is `embed`,
  # B [r, out] on its second: q, k, v, gate, up read `embed`; o, down write it.
  dims = {"q": (D, N * H), "k": (D, K * H), "v": (D, K * H), "o": (N * H, D),
          "gate": (D, F), "up": (D, F), "down": (F, D)}
  adapters = 0
  for name, (i, o) in dims.items():
    a_split = FSDP if name in ("q", "k", "v", "gate", "up") else 1
    b_split = FSDP if name in ("o", "down") else 1
    adapters += L * 4 * (i * r // a_split + r * o // b_split)
  params = _param_bytes_per_chip() + adapters
  adam = 2 * adapters + 2 * 4
  assert got["train_step"]["resident"] == adapters  # the reference: zero adapters only
  assert got["score"]["resident"] == adam + adapters
  batch = B // FSDP * ((P + T) * 5 + T * (1 + 3 * 4) + 4 + 2) + 8
  assert 0 <= got["train_step"]["argument"] - params - adam <= batch
  epochs = hard.get_config("micro").rl.num_epochs
  layers = L * (D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
                + N * H + 2 * K * H + 2 * D) + D
  lora_weights = sum(L * r * (i + o) for i, o in dims.values())
  assert got["train_step"]["flops"] == 4 * epochs * (
      (layers + lora_weights) * B * (P + T) + V * D * B * T)
  assert "LoRA rank 4" in got["train_step"]["inputs"]
