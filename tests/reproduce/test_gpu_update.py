"""The gpu_update section's parts that need no accelerator: the profile's op totals,
the tables, its refusal of a machine without one, and a failed variant on a tiny policy."""

import json
import types

import jax
import pytest

from isojax import storage
from isojax.reproduce import gpu, gpu_update, tables


def _event(name, ns):
  return types.SimpleNamespace(name=name, duration_ns=ns)


def test_op_times_sums_the_busiest_device_line_by_name():
  """Host planes are ignored; of the device lines, the one with the most time is
  summed by event name and ranked by milliseconds."""
  data = types.SimpleNamespace(planes=[
      types.SimpleNamespace(name="/host:CPU", lines=[types.SimpleNamespace(
          name="python", events=[_event("host", 10**12)])]),
      types.SimpleNamespace(name="/device:GPU:0", lines=[
          types.SimpleNamespace(name="XLA Modules", events=[_event("jit_train_step", 9e6)]),
          types.SimpleNamespace(name="Stream #14", events=[
              _event("gemm", 4e6), _event("add", 1e6), _event("gemm", 3e6),
              _event("copy", 2.5e6)])])])
  got = gpu_update.op_times(data)
  assert got["total_ms"] == pytest.approx(10.5)
  assert got["ops"] == [("gemm", 7.0, 2), ("copy", 2.5, 1), ("add", 1.0, 1)]


def test_tables_give_each_variants_mfu_and_the_profiles_shares():
  result = dict(peak_flops=1e15, variants=[
      dict(name="a", micro_batch=4, chunk=32, temp_gib=25.64, update_s=6.0, score_s=1.33,
           model_tflops=100.0),
      dict(name="b", skipped=True)])
  rows = gpu_update.table(result)
  assert rows[2] == "| a | 4 | 32 | 25.6 | 6.00 | 100 | 10.0% | 1.33 |"
  assert "not run" in rows[3]
  profile = dict(total_ms=200.0, ops=[("gemm", 150.0, 3), ("add", 50.0, 7)])
  lines = gpu_update.profile_table(profile, top=1)
  assert lines[-1] == "| `gemm` | 150 | 3 | 75.0% |"
  assert gpu_update.profile_table(None)[0].startswith("No profile")


def test_the_section_refuses_a_machine_without_an_accelerator(tmp_path):
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=".", command="")
  with pytest.raises(RuntimeError, match="gpu_update section measures an accelerator"):
    gpu_update.run(inv)


def test_the_variants_run_the_gpu_sections_own_fields():
  """gpu_update's settings and the gpu section's flags come from one list of fields: the
  flags are the ones the section has always passed, and the settings hold them."""
  assert gpu.run_flags("/p", 4, 8, 16, 512) == [
      "--config.base_model.path=/p", "--config.model.dtype=bfloat16",
      "--config.model.remat=full", "--config.model.attention_impl=auto",
      "--config.num_steps=4", "--config.problems_per_batch=8",
      "--config.rollouts_per_problem=16", "--config.sampling.max_new_tokens=512",
      "--config.task.num_val=8", "--config.eval.train_problems=0",
      "--config.eval.schedule=linear", "--config.eval.every=4", "--config.checkpoint_every=4",
      "--config.checkpoint_keep=1", "--config.metric_writers.tensorboard=False"]
  s = gpu_update._hard_settings("/p")
  assert (s.problems_per_batch, s.rollouts_per_problem, s.sampling.max_new_tokens) == (
      gpu.PROBLEMS, gpu.ROLLOUTS, gpu.NEW_TOKENS)
  assert s.model.dtype == "bfloat16" and s.model.remat == "full"
  assert s.rollouts_per_step == gpu.PROBLEMS * gpu.ROLLOUTS


@pytest.mark.slow("writes a tiny policy and compiles its update for two variants")
def test_a_failed_variant_is_recorded_and_the_others_run_on_the_policy_as_loaded(
    tmp_path, monkeypatch):
  """On a tiny policy (CPU): a setting the device refuses (cuDNN attention) and an out of
  memory that consumes the donated parameters each fail alone. The variant after the
  out of memory runs on the policy reloaded: its loss is the first variant's, which ran
  the same program on the policy as loaded. The partial result is on disk after each."""
  policy = str(tmp_path / "policy")
  gpu.write_policy(policy, dict(gpu.QWEN25_1P5B, num_layers=1, embed_dim=32, num_heads=2,
                                num_kv_heads=1, head_dim=16, mlp_dim=64, vocab_size=64))
  variants = (("a", "full", "bf16x2", "xla", 0), ("cudnn", "full", "bf16x2", "cudnn", 0),
              ("oom", "none", "bf16x2", "xla", 0), ("a again", "full", "bf16x2", "xla", 0))
  real_step, real_write = gpu_update._step, storage.write_json
  calls, written = [], []

  def step(compiled, carry, batch):
    calls.append(len(calls))
    if len(calls) == 3:  # "oom"'s first call: "a" called it twice, "cudnn" never
      for x in jax.tree.leaves(carry):
        x.delete()
      raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying "
                                       "to allocate 9.00GiB.\nmore detail")
    return real_step(compiled, carry, batch)

  def write_json(path, obj, **kw):
    written.append([v["name"] for v in obj["variants"]])
    return real_write(path, obj, **kw)

  monkeypatch.setattr(gpu_update, "_step", step)
  monkeypatch.setattr(gpu_update.storage, "write_json", write_json)
  out = str(tmp_path / "update.json")
  result = gpu_update.measure(policy, budget_s=600, out_path=out, variants=variants,
                              allocation=(2, 2, 8))
  assert written == [["a"], ["a", "cudnn"], ["a", "cudnn", "oom"],
                     ["a", "cudnn", "oom", "a again"]]
  assert storage.read_json(out)["variants"] == json.loads(json.dumps(result["variants"]))
  first, cudnn, oom, again = result["variants"]
  assert "error" not in first and "error" not in again
  assert cudnn["error"].startswith("ValueError: model.attention_impl='cudnn' needs a GPU")
  assert oom["error"] == ("JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while "
                          "trying to allocate 9.00GiB.")
  assert again["loss"] == first["loss"]
  assert (result["rows"], result["new_tokens"]) == (4, 8)
  rows = gpu_update.table(result)
  assert rows[3].startswith("| cudnn | failed: ValueError: model.attention_impl='cudnn'")
  assert rows[4] == ("| oom | failed: JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory "
                     "while trying to allocate 9.00GiB. | | | | | | |")

