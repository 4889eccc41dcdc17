"""The memory plan: its choices by brute force, and the runs it refuses before anything
is written (its estimates against XLA's own accounting: test_memory_estimates.py)."""

import dataclasses

import pytest

from isojax.config import config_lib
from isojax.configs import hard
from isojax.models.transformer import ModelConfig
from isojax.run import memory_estimates, memory_plan, run_inputs, train

GIB = 1024 ** 3


SMOLLM2 = memory_estimates.Shape(vocab_size=49152, num_layers=30, embed_dim=576, num_heads=9,
                                 num_kv_heads=3, head_dim=64, mlp_dim=1536, tie_embeddings=True)


def _step(**kw):
  base = dict(rollouts=256, minibatch=256, group=16, sample_rollouts=2048, prompt_len=120,
              max_new_tokens=256, trained_params=SMOLLM2.params, reference=True)
  return memory_plan.Step(**{**base, **kw})


@pytest.mark.parametrize("available_gib", [8, 24, 96])
def test_an_accelerator_keeps_the_micro_batch_and_takes_larger_lm_head_chunks(available_gib):
  """With an accelerator's logits budget the micro-batch is the one the CPU budget
  gives; the chunk is at least the CPU plan's, its logits within the accelerator's
  budget, its update within the plan's budget; with room to spare it is larger."""
  step, fraction = _step(), 0.8
  args = (SMOLLM2, step, memory_plan.Passes(0, 0, 0), available_gib * GIB, fraction)
  cpu = memory_plan.plan(*args)
  gpu = memory_plan.plan(*args, memory_plan.LOGIT_BYTES["accelerator"])
  assert gpu.passes.micro_batch_size == cpu.passes.micro_batch_size
  rows = gpu.passes.micro_batch_size or step.minibatch
  full = step.max_new_tokens
  chunk, cpu_chunk = gpu.passes.logprob_chunk_size or full, cpu.passes.logprob_chunk_size or full
  assert chunk >= cpu_chunk
  assert rows * chunk * SMOLLM2.vocab_size * 4 * 3 <= 8 * GIB
  seq = step.prompt_len + full
  assert memory_estimates.update_bytes(SMOLLM2, rows, seq, full, chunk) <= gpu.budget
  if available_gib == 96:
    assert chunk > cpu_chunk, (chunk, cpu_chunk)


QWEN25_1P5B = memory_estimates.Shape(vocab_size=151936, num_layers=28, embed_dim=1536,
                                     num_heads=12, num_kv_heads=2, head_dim=128, mlp_dim=8960,
                                     tie_embeddings=True, activation_bytes=2, remat="full")


@pytest.mark.parametrize("shape,available_gib", [(SMOLLM2, 8), (SMOLLM2, 24), (SMOLLM2, 96),
                                                 (QWEN25_1P5B, 59.4)])
def test_overlapped_generation_keeps_its_sampler_calls_beside_larger_chunks(shape,
                                                                           available_gib):
  """Generation overlapped with the update (two bfloat16 weight copies) keeps the
  sampler calls the smallest chunks leave it (0: one call, the most) whatever chunk an
  accelerator's logits budget allows; at the gpu section's pipelined run (1.5B, 8 x 16
  rollouts of 512 tokens, 59.4 GiB) a chunk sized to the budget alone left calls of 16
  against 62."""
  step = _step(rollouts=128, minibatch=128, sample_rollouts=128, prompt_len=32,
               max_new_tokens=512, trained_params=shape.params, generator_copies=2,
               sample_weight_bytes=2 * shape.params, generator_param_bytes=2)
  args = (shape, step, memory_plan.Passes(0, 0, 0), int(available_gib * GIB), 0.8)
  most = lambda calls: calls or step.sample_rollouts
  cpu, gpu = memory_plan.plan(*args), memory_plan.plan(*args, 8 * GIB)
  assert most(gpu.passes.max_rollouts_per_call) >= most(cpu.passes.max_rollouts_per_call)
  full = step.max_new_tokens
  assert (gpu.passes.logprob_chunk_size or full) >= (cpu.passes.logprob_chunk_size or full)
  assert gpu.peak <= int(available_gib * GIB)


@pytest.mark.parametrize("available_gib", [8, 24, 96])
def test_the_largest_micro_batch_that_fits_is_chosen(available_gib):
  """Brute force over the divisors: the chosen one fits the budget, the next larger
  does not; the LM head never holds more than LOGIT_BYTES of logits."""
  step, fraction = _step(), 0.35
  result = memory_plan.plan(SMOLLM2, step, memory_plan.Passes(0, 0, 0),
                            available_gib * GIB, fraction)
  rows = result.passes.micro_batch_size or step.minibatch
  seq = step.prompt_len + step.max_new_tokens

  def cost(r):
    chunk = memory_plan._chunk_for(SMOLLM2, r, step.max_new_tokens)  # pylint: disable=protected-access
    return max(memory_estimates.update_bytes(SMOLLM2, r, seq, step.max_new_tokens, chunk),
               memory_estimates.score_bytes(SMOLLM2, r, seq, step.max_new_tokens, chunk))

  divisors = [d for d in range(1, step.minibatch + 1) if step.minibatch % d == 0]
  fitting = [d for d in divisors if cost(d) <= result.budget]
  assert rows == (max(fitting) if fitting else 1)
  chunk = result.passes.logprob_chunk_size or step.max_new_tokens
  assert rows * chunk * SMOLLM2.vocab_size * 4 * 3 <= 256 * 1024 ** 2
  # the whole [B, T, V] logits of the step would not have fitted
  assert step.rollouts * step.max_new_tokens * SMOLLM2.vocab_size * 4 > 256 * 1024 ** 2
  calls = result.passes.max_rollouts_per_call
  if calls:
    assert memory_estimates.sample_bytes(SMOLLM2, calls, step.prompt_len,
                                         step.max_new_tokens) <= max(result.budget, 0) or (
                                             calls == step.group)


def test_a_small_model_keeps_one_pass_and_one_call():
  tiny = memory_estimates.Shape(vocab_size=20, num_layers=2, embed_dim=64, num_heads=4,
                                num_kv_heads=2, head_dim=16, mlp_dim=128, tie_embeddings=True)
  result = memory_plan.plan(tiny, _step(max_new_tokens=8, prompt_len=12,
                                        trained_params=tiny.params),
                            memory_plan.Passes(0, 0, 0), 16 * GIB)
  assert result.passes == memory_plan.Passes(0, 0, 0)


def test_passes_set_by_hand_are_kept():
  result = memory_plan.plan(SMOLLM2, _step(), memory_plan.Passes(32, 64, 512), 96 * GIB)
  assert result.passes == memory_plan.Passes(32, 64, 512)


def test_context_overflow_names_the_fields():
  with pytest.raises(ValueError, match=r"sampling\.max_new_tokens=100000 .* 40 tokens .*"
                                       r"task\.max_prompt_tokens.*context of 4096.*"
                                       r"config\.json.*4056"):
    run_inputs.check_context(prompt_len=40, max_new_tokens=100000, context=4096,
                             source="ckpt/config.json")
  run_inputs.check_context(prompt_len=40, max_new_tokens=4056, context=4096, source="x")


def _smollm2_config(**fields):
  config = hard.get_config()
  config.sampling.max_new_tokens = 256
  for key, value in fields.items():
    parent = config
    *path, leaf = key.split(".")
    for part in path:
      parent = parent[part]
    parent[leaf] = value
  return config_lib.settings(config_lib.resolve(config))


def _smollm2_model_config():
  return ModelConfig(vocab_size=49152, num_layers=30, embed_dim=576, num_heads=9,
                     num_kv_heads=3, head_dim=64, mlp_dim=1536, tie_embeddings=True)


def test_an_estimate_above_the_machine_is_refused_naming_fields():
  config = _smollm2_config(**{"rl.micro_batch_size": 256})
  with pytest.raises(ValueError, match=r"estimated peak memory is .* above the 8\.0 GiB.*"
                                       r"set by hand: rl\.micro_batch_size=256.*leave those "
                                       r"fields at 0"):
    memory_plan.for_settings(config, _smollm2_model_config(), prompt_len=120,
                           available=8 * GIB)
  with pytest.raises(ValueError, match=r"above the 1\.0 GiB.*problems_per_batch=16") as e:
    memory_plan.for_settings(_smollm2_config(), _smollm2_model_config(), prompt_len=120,
                           available=1 * GIB)
  assert "max_staleness" not in str(e.value)
  with pytest.raises(ValueError, match=r"rl\.max_staleness=3 \(its generator holds 4 copies"
                                       r".*mesh\.rollout_fraction"):
    memory_plan.for_settings(_smollm2_config(**{"rl.max_staleness": 3}),
                           _smollm2_model_config(), prompt_len=120, available=1 * GIB)
  derived = memory_plan.for_settings(_smollm2_config(), _smollm2_model_config(), prompt_len=120,
                                   available=24 * GIB)
  assert derived.peak <= 24 * GIB * memory_plan.USABLE_FRACTION["cpu"]
  assert derived.passes.micro_batch_size and derived.passes.logprob_chunk_size


def test_a_run_beyond_the_context_writes_nothing(tmp_path):
  config = hard.get_config("micro")
  config.sampling.max_new_tokens = 100000
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"sampling\.max_new_tokens=100000.*context of 4096"):
    train.run(config, str(workdir))
  assert not workdir.exists()


def test_the_shipped_demo_keeps_one_pass_and_one_call():
  """The tiny demo base: its programs are those it had before passes were planned."""
  s = config_lib.settings(config_lib.resolve(hard.get_config("micro")))
  planned, plan = run_inputs.plan_passes(s, run_inputs.policy_path(s), prompt_len=16)
  assert plan.passes == memory_plan.Passes(0, 0, 0)
  assert dataclasses.astuple(plan.passes) == (planned.rl.micro_batch_size,
                                              planned.rl.logprob_chunk_size,
                                              planned.sampling.max_rollouts_per_call)
  assert planned == s  # nothing to fill in: the settings come back as they were


@pytest.mark.parametrize("cast", [False, True])
@pytest.mark.parametrize("available_gib", [0.5, 2.0, 8.0, 64.0])
def test_a_sampling_job_calls_the_most_rollouts_that_fit(available_gib, cast):
  """Brute force over call sizes: the weights (and their bfloat16 cast for the sampler)
  plus r rollouts' caches, prefill and logits within the usable fraction of the memory."""
  available, fraction = int(available_gib * memory_plan.GIB), memory_plan.USABLE_FRACTION["cpu"]
  cast_bytes = 2 * SMOLLM2.params if cast else 0
  kw = dict(rollouts=4096, group=16, prompt_len=120, max_new_tokens=256, cast_bytes=cast_bytes)
  fits = lambda r: (4 * SMOLLM2.params + cast_bytes
                    + memory_estimates.sample_bytes(SMOLLM2, r, 120, 256) <= available * fraction)
  if not fits(16):
    with pytest.raises(ValueError, match="sampling 16 rollouts of one problem"):
      memory_plan.sampler_calls(SMOLLM2, available=available, **kw)
    return
  got = memory_plan.sampler_calls(SMOLLM2, available=available, **kw)
  if fits(4096):
    assert got == 0  # one call
  else:
    assert fits(got) and not fits(got + 1) and got >= 16


@pytest.mark.parametrize("available_gib", [6, 12, 40])
def test_a_pipelined_run_plans_its_generator_beside_the_update(available_gib):
  """Off-policy generation on the learner's devices: a copy of the weights and the next
  batch's sampler call live beside the update and beside an evaluation's call. The
  calls chosen are the largest that satisfy that (brute force), and the peak counts it."""
  step, fraction = _step(rollouts=64, minibatch=64), 0.8
  alone = memory_plan.plan(SMOLLM2, step, memory_plan.Passes(0, 0, 0), available_gib * GIB,
                           fraction)
  beside = memory_plan.plan(SMOLLM2, dataclasses.replace(step, generator_copies=2),
                            memory_plan.Passes(0, 0, 0), available_gib * GIB, fraction)
  weights = 2 * 4 * SMOLLM2.params
  p = memory_estimates.sample_bytes(SMOLLM2, 1, step.prompt_len, step.max_new_tokens)
  rows = beside.passes.micro_batch_size or step.minibatch
  seq = step.prompt_len + step.max_new_tokens
  chunk = beside.passes.logprob_chunk_size
  update = max(memory_estimates.update_bytes(SMOLLM2, rows, seq, step.max_new_tokens, chunk),
               memory_estimates.score_bytes(SMOLLM2, rows, seq, step.max_new_tokens, chunk))
  budget = beside.budget - weights
  fits = [c for c in range(1, step.sample_rollouts + 1)
          if min(c, step.rollouts) * p + max(update, c * p) <= budget]
  calls = beside.passes.max_rollouts_per_call or step.sample_rollouts
  assert calls == max(max(fits, default=0), step.group) or (
      not beside.passes.max_rollouts_per_call and max(fits) >= step.sample_rollouts)
  train_call = memory_estimates.sample_bytes(SMOLLM2, min(calls, step.rollouts),
                                             step.prompt_len, step.max_new_tokens)
  assert beside.generator == weights + train_call
  assert beside.peak == beside.resident + weights + train_call + max(
      beside.update, beside.score, beside.sample)
  # What the plan counts stays within the share of the memory it plans for (unlike the
  # same calls planned as if nothing ran beside the update).
  if max(fits, default=0) >= step.group:  # else the smallest call, refused if too big
    assert beside.peak <= int(available_gib * GIB * fraction)
  assert alone.generator == 0


def test_only_generation_on_the_learners_devices_is_overlapped():
  cfg = _smollm2_model_config()
  plan = lambda **f: memory_plan.for_settings(_smollm2_config(**f), cfg, prompt_len=120,
                                            available=64 * GIB, kind="accelerator")
  assert plan().generator == 0
  weights = 4 * memory_estimates.Shape.of(cfg).params
  # k versions queued and the one being sampled from; in flight, two.
  for fields, copies in (({"rl.max_staleness": 1}, 2), ({"rl.max_staleness": 3}, 4),
                         ({"rl.max_staleness": 3, "rl.off_policy": "pipeline_in_flight"}, 2)):
    result = plan(**fields)
    rollouts = 16 * 16  # hard.py's B_p x n
    call = min(result.passes.max_rollouts_per_call or rollouts, rollouts)
    shape = memory_estimates.Shape.of(cfg)
    assert result.generator == copies * weights + memory_estimates.sample_bytes(
        shape, call, 120, 256), fields
  assert "beside them the generator" in plan(**{"rl.max_staleness": 1}).describe()


@pytest.mark.parametrize("available_gib", [8, 12, 20, 40])
def test_a_pipelined_run_takes_a_smaller_micro_batch_to_sample_whole_batches(available_gib):
  """Brute force: the largest micro-batch whose update leaves room beside it for the
  generator's copies and a whole training batch's sampler call; only when none does, the
  largest that fits alone (and the generator samples in smaller calls)."""
  step, fraction = _step(rollouts=64, minibatch=64, generator_copies=2), 0.8
  result = memory_plan.plan(SMOLLM2, step, memory_plan.Passes(0, 0, 0), available_gib * GIB,
                            fraction)
  seq, response = step.prompt_len + step.max_new_tokens, step.max_new_tokens
  p = memory_estimates.sample_bytes(SMOLLM2, 1, step.prompt_len, step.max_new_tokens)

  def cost(r):
    chunk = memory_plan._chunk_for(SMOLLM2, r, response)  # pylint: disable=protected-access
    return max(memory_estimates.update_bytes(SMOLLM2, r, seq, response, chunk),
               memory_estimates.score_bytes(SMOLLM2, r if r < 64 else 64, seq, response, chunk))

  room = result.budget - 2 * 4 * SMOLLM2.params
  divisors = [d for d in range(64, 0, -1) if 64 % d == 0]
  beside = [d for d in divisors if cost(d) + 64 * p <= room]
  alone = [d for d in divisors if cost(d) <= room]
  expected = beside[0] if beside else alone[0] if alone else 1
  assert (result.passes.micro_batch_size or 64) == expected
  if beside:  # a whole training batch in one call
    calls = result.passes.max_rollouts_per_call
    assert calls == 0 or calls >= step.rollouts


def test_a_bfloat16_model_plans_its_sampler_cast_of_the_weights():
  """Under bfloat16 activations a sampler call holds a bfloat16 copy of every weight
  (2 bytes a parameter) beside its caches; float32 activations, or weights sampled as
  stored (`sampling.weights_dtype=float32`), hold none; bfloat16 weights asked for under
  float32 activations are a cast too."""
  cfg = _smollm2_model_config()
  params = memory_estimates.Shape.of(cfg).params
  cast = lambda **f: memory_plan.sample_weight_bytes(_smollm2_config(**f),
                                                     memory_estimates.Shape.of(cfg))
  assert cast() == 0
  assert cast(**{"model.dtype": "bfloat16"}) == 2 * params
  assert cast(**{"model.dtype": "bfloat16", "sampling.weights_dtype": "float32"}) == 0
  assert cast(**{"sampling.weights_dtype": "bfloat16"}) == 2 * params
  plan = lambda **f: memory_plan.for_settings(_smollm2_config(**f), cfg, prompt_len=120,
                                              available=24 * GIB)
  calls = {"model.dtype": "bfloat16", "sampling.max_rollouts_per_call": 64}
  bf16, stored = plan(**calls), plan(**calls, **{"sampling.weights_dtype": "float32"})
  assert bf16.passes == stored.passes
  assert bf16.sample - stored.sample == 2 * params
  # Derived calls leave room for the copy: fewer rollouts fit beside it.
  derived = plan(**{"model.dtype": "bfloat16"})
  as_stored = plan(**{"model.dtype": "bfloat16", "sampling.weights_dtype": "float32"})
  assert 0 < derived.passes.max_rollouts_per_call < as_stored.passes.max_rollouts_per_call
  assert derived.peak <= 24 * GIB * memory_plan.USABLE_FRACTION["cpu"]


def test_off_policy_generation_keeps_its_copies_in_the_samplers_dtype():
  """Under bfloat16 activations the generator's copies are bfloat16 (2 bytes a parameter,
  cast once per version: its calls cast none); LoRA runs and float32 activations keep
  float32 copies. The plan's generator is the copies plus one training batch's call."""
  cfg = _smollm2_model_config()
  params = memory_estimates.Shape.of(cfg).params
  settings = lambda **f: _smollm2_config(**{"rl.max_staleness": 1, **f})
  assert settings(**{"model.dtype": "bfloat16"}).generator_weights_dtype == "bfloat16"
  assert settings().generator_weights_dtype is None
  assert settings(**{"model.dtype": "bfloat16",
                     "sampling.weights_dtype": "float32"}).generator_weights_dtype is None
  assert settings(**{"model.dtype": "bfloat16",
                     "model.lora.rank": 4}).generator_weights_dtype is None
  fixed = {"model.dtype": "bfloat16", "sampling.max_rollouts_per_call": 64,
           "rl.micro_batch_size": 8}
  plan = memory_plan.for_settings(settings(**fixed), cfg, prompt_len=120, available=24 * GIB)
  copies = memory_plan.generator_copies(settings(**fixed))
  calls = memory_estimates.sample_bytes(memory_estimates.Shape.of(cfg), 64, 120, 256)
  assert copies == 2 and plan.generator == 2 * params * copies + calls
