"""LoRA (`model.lora`): adapters beside the projections, checked against the base model,
against weights merged in NumPy, against `transformers` (merged export) and `peft`
(adapter export); the update trains the adapters alone; bad fields are named."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from isojax.config import config_lib
from isojax.configs import hard
from isojax.models import hf_checkpoint, lora, transformer
from isojax.models.settings import LORA_TARGETS, LoraSettings
from isojax.run import run_inputs

RANK, ALPHA = 4, 8.0


def _base_path():
  return run_inputs.policy_path(config_lib.settings(config_lib.resolve(hard.get_config("micro"))))


def _tokens(vocab: int, b: int = 3, s: int = 12):
  tokens_BS = jax.random.randint(jax.random.key(1), (b, s), 1, vocab)
  return tokens_BS, jnp.ones((b, s), bool)


def _with_random_b(model):
  """The adapters' B matrices drawn at random (they start at zero), in place."""
  adapters, _ = lora.split(nnx.state(model))
  flat = [(path, var.replace(0.05 * jax.random.normal(jax.random.key(len(path) + i),
                                                      var.shape)) if path[-1] == "b" else var)
          for i, (path, var) in enumerate(nnx.to_flat_state(adapters))]
  nnx.update(model, nnx.from_flat_state(flat))
  return model


def _numpy_merged(model) -> dict[tuple, np.ndarray]:
  """Every base kernel plus alpha / rank * A @ B per layer, computed in NumPy."""
  flat = {path: np.asarray(var[...], np.float64)
          for path, var in nnx.to_flat_state(nnx.state(model))}
  merged = {p: v for p, v in flat.items() if not any(k.endswith("_lora") for k in p)}
  for path in flat:
    if path[-1] == "a":
      a, b = flat[path], flat[(*path[:-1], "b")]
      kernel = (*path[:-2], path[-2].removesuffix("_lora"), "kernel")
      merged[kernel] = merged[kernel] + np.stack(
          [a[l] @ b[l] for l in range(a.shape[0])]) * ALPHA / RANK
  return merged


@pytest.fixture(scope="module")
def adapted():
  """(base model, adapted model with random B) on the shipped arithmetic base."""
  settings = dict(rank=RANK, alpha=ALPHA, targets=LORA_TARGETS, dropout=0.0)
  base = hf_checkpoint.load_model(_base_path())
  model = _with_random_b(hf_checkpoint.load_model(_base_path(), lora=settings))
  return base, model


def test_adapters_with_zero_b_leave_the_logits_bit_identical():
  base = hf_checkpoint.load_model(_base_path())
  model = hf_checkpoint.load_model(_base_path(), lora=dict(rank=RANK, alpha=ALPHA,
                                                          targets=("q_proj", "down_proj"),
                                                          dropout=0.0))
  tokens, mask = _tokens(base.cfg.vocab_size)
  np.testing.assert_array_equal(np.asarray(model(tokens, mask)), np.asarray(base(tokens, mask)))
  # A as Transformer(cfg, rngs=nnx.Rngs(0)) draws it (PEFT's U(+-1/sqrt(in))), B zero.
  drawn = transformer.Transformer(model.cfg, rngs=nnx.Rngs(0))
  a = model.layers.attn.q_proj_lora.a[...]
  np.testing.assert_array_equal(a, drawn.layers.attn.q_proj_lora.a[...])
  assert np.abs(a).max() <= base.cfg.embed_dim ** -0.5 and np.abs(a).max() > 0
  assert not np.any(model.layers.mlp.down_proj_lora.b[...])
  assert model.layers.attn.k_proj_lora is None  # not a target


def test_adapted_logits_equal_numpy_merged_weights_and_merged_model(adapted):
  base, model = adapted
  tokens, mask = _tokens(base.cfg.vocab_size)
  graphdef, state = nnx.split(base)
  merged = _numpy_merged(model)
  reference = nnx.merge(graphdef, nnx.from_flat_state(
      [(p, v.replace(jnp.asarray(merged[p], jnp.float32))) for p, v in nnx.to_flat_state(state)]))
  want = np.asarray(reference(tokens, mask))
  got = np.asarray(model(tokens, mask))
  assert np.abs(got - np.asarray(base(tokens, mask))).max() > 1e-3  # the adapters act
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(lora.merged_model(model)(tokens, mask)), want,
                             atol=2e-5, rtol=1e-5)


def test_merged_export_matches_transformers_and_peft_matches_the_adapters(adapted, tmp_path):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  peft = pytest.importorskip("peft")
  base, model = adapted
  tokens, mask = _tokens(base.cfg.vocab_size)
  ours = np.asarray(model(tokens, mask))
  with pytest.raises(ValueError, match="LoRA adapters.*merged_model.*save_peft"):
    hf_checkpoint.save_model(model, str(tmp_path / "refused"), eos_token_id=2,
                             bos_token_id=1, pad_token_id=0)
  hf_checkpoint.save_model(lora.merged_model(model), str(tmp_path / "merged"), eos_token_id=2,
                           bos_token_id=1, pad_token_id=0)
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"),
                                                             dtype=torch.float32)
  with torch.no_grad():
    hf_logits = merged(torch.tensor(np.asarray(tokens))).logits.numpy()
  np.testing.assert_allclose(hf_logits, ours, atol=5e-5, rtol=1e-4)

  lora.save_peft(model, str(tmp_path / "adapter"), base_model_name_or_path=_base_path())
  with open(tmp_path / "adapter" / lora.PEFT_CONFIG) as f:
    config = json.load(f)
  assert (config["r"], config["lora_alpha"], config["peft_type"]) == (RANK, ALPHA, "LORA")
  plain = transformers.AutoModelForCausalLM.from_pretrained(_base_path(), dtype=torch.float32)
  adapted_hf = peft.PeftModel.from_pretrained(plain, str(tmp_path / "adapter"))
  with torch.no_grad():
    peft_logits = adapted_hf(torch.tensor(np.asarray(tokens))).logits.numpy()
  np.testing.assert_allclose(peft_logits, ours, atol=5e-5, rtol=1e-4)


@pytest.mark.parametrize("fields,message", [
    (dict(rank=-1), r"model\.lora\.rank=-1: expected an integer >= 0"),
    (dict(rank=4, alpha=0), r"model\.lora\.alpha=0"),
    (dict(rank=4, targets=("q_proj", "attn")), r"\['attn'\] name no layer"),
    (dict(rank=4, targets=()), r"model\.lora\.targets=\(\): expected a non-empty list"),
    (dict(rank=4, dropout=0.1), r"model\.lora\.dropout=0\.1: only 0 is supported"),
])
def test_bad_lora_fields_are_named(fields, message):
  config = hard.get_config("micro")
  config.model.lora.update(fields)
  with pytest.raises(ValueError, match=message):
    config_lib.resolve(config)


def test_a_rank_above_a_layers_width_and_lora_with_a_critic_are_refused():
  with pytest.raises(ValueError, match=r"model\.lora\.rank=129: larger than q_proj's width "
                     "128"):
    hf_checkpoint.load_model(_base_path(), lora=dict(rank=129, alpha=1.0,
                                                     targets=("q_proj",), dropout=0.0))
  config = hard.get_config("micro")
  config.model.lora.rank = 4
  config.rl.advantage = "gae"
  with pytest.raises(ValueError, match="model.lora.rank > 0 with rl.advantage='gae' and "
                     "critic.trunk='own'"):
    config_lib.resolve(config)
  config.critic.update(trunk="policy", train_trunk=False)  # a head on the policy's trunk
  assert config_lib.resolve(config).critic.trunk == "policy"
  assert LoraSettings().enabled is False and dataclasses.replace(LoraSettings(), rank=2).enabled


@pytest.mark.slow("three LoRA runs, one resumed")
def test_checkpoints_hold_the_adapters_and_resume_exactly(tmp_path):
  from isojax import run_dir  # pylint: disable=g-import-not-at-top
  from isojax.run import train  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  config = hard.get_config("micro")
  config.model.lora.rank = RANK
  config.optim.learning_rate = 1e-2
  config.update(num_steps=4, checkpoint_every=2)
  train.run(config, str(tmp_path / "full"))
  ckpt = ocp.CheckpointManager(run_dir.checkpoint_dir(str(tmp_path / "full")))
  saved = ckpt.restore(4, args=ocp.args.Composite(params=ocp.args.StandardRestore()))
  ckpt.close()
  paths = ["/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.State(saved.params))]
  assert paths and all("_lora/" in p for p in paths), paths  # no base weight

  interrupted = tmp_path / "interrupted"
  os.makedirs(interrupted)
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(tmp_path / "full", interrupted, dirs_exist_ok=True)
  shutil.rmtree(interrupted / "checkpoints" / "4")
  train.run(config, str(interrupted))
  strip = lambda lines: [run_dir.without_timings(r) for r in lines]
  assert strip(run_dir.read_metrics(str(interrupted))) == strip(
      run_dir.read_metrics(str(tmp_path / "full")))

  # launch.export: the merged checkpoint through transformers and the adapters through
  # peft give the trained policy's logits.
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  peft = pytest.importorskip("peft")
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from isojax import export  # pylint: disable=g-import-not-at-top
  model, base_path, step = export.restored_policy(str(tmp_path / "full"))
  assert step == 4 and np.any(np.asarray(model.layers.attn.q_proj_lora.b[...]))
  tokens, mask = _tokens(model.cfg.vocab_size)
  ours = np.asarray(model(tokens, mask))
  # The command for the adapters; the merged checkpoint as the command writes it.
  proc = subprocess.run([sys.executable, "-m", "launch.export",
                         f"--workdir={tmp_path / 'full'}", f"--out={tmp_path / 'peft'}",
                         "--format=peft"], capture_output=True, text=True, timeout=300,
                        cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                            os.path.abspath(__file__)))))
  assert proc.returncode == 0, proc.stderr[-3000:]
  export.save_hf(model, base_path, str(tmp_path / "hf"))
  merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"),
                                                             dtype=torch.float32)
  plain = transformers.AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
  adapted_hf = peft.PeftModel.from_pretrained(plain, str(tmp_path / "peft"))
  with torch.no_grad():
    for hf_model in (merged, adapted_hf):
      logits = hf_model(torch.tensor(np.asarray(tokens))).logits.numpy()
      np.testing.assert_allclose(logits, ours, atol=5e-5, rtol=1e-4)
  assert os.path.isfile(tmp_path / "hf" / "tokenizer.json")


def test_the_trained_part_is_the_adapters_alone_and_joins_back_to_the_policy(adapted):
  _, model = adapted
  graphdef, params = nnx.split(model)
  paths = {path for path, _ in nnx.to_flat_state(params)}
  adapters = {p for p in paths if any(k.endswith("_lora") for k in p)}
  trained, frozen = lora.trained_and_frozen(params, enabled=True)
  assert {p for p, _ in nnx.to_flat_state(trained)} == adapters
  assert {p for p, _ in nnx.to_flat_state(frozen)} == paths - adapters
  everything, none = lora.trained_and_frozen(params, enabled=False)
  assert everything is params and none is None
  for got, want in ((lora.whole(trained, frozen), params), (lora.whole(params, None), params),
                    (nnx.state(lora.as_model(graphdef, trained, frozen)), params)):
    got, want = dict(nnx.to_flat_state(got)), dict(nnx.to_flat_state(want))
    assert got.keys() == want.keys()
    for path in want:
      np.testing.assert_array_equal(got[path][...], want[path][...])


def test_the_sampler_decodes_with_the_adapters_merged(adapted):
  """`sampler.sample` merges the adapters once per call: its rollouts are those of the
  merged model; decoding through the adapters instead (merge_adapters=False) is the
  same function, so greedy decoding picks the same tokens."""
  from isojax.sampling import sampler  # pylint: disable=g-import-not-at-top
  _, model = adapted
  prompts = jax.random.randint(jax.random.key(5), (3, 6), 1, model.cfg.vocab_size)
  mask = jnp.ones(prompts.shape, bool)
  spec = sampler.SampleSpec(n=2, max_new_tokens=8, temperature=1.0, stop_ids=(), pad_id=0)
  got = sampler.sample(*nnx.split(model), prompts, mask, jax.random.key(0), spec)
  want = sampler.sample(*nnx.split(lora.merged_model(model)), prompts, mask,
                        jax.random.key(0), spec)
  np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens))
  np.testing.assert_allclose(np.asarray(got.logprobs), np.asarray(want.logprobs), atol=1e-5)
  greedy = dataclasses.replace(spec, temperature=0.0)
  merged = sampler.sample(*nnx.split(model), prompts, mask, jax.random.key(0), greedy)
  unmerged = sampler.sample(*nnx.split(model), prompts, mask, jax.random.key(0),
                            dataclasses.replace(greedy, merge_adapters=False))
  np.testing.assert_array_equal(np.asarray(merged.tokens), np.asarray(unmerged.tokens))
