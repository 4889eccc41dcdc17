"""launch.bench on a tiny model: what each side counts, same weights, the waste formula.

No timing is asserted: only the counts, the equality of the two implementations'
greedy continuations, and the shape of the JSON the command writes.
"""

import dataclasses
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import jax  # pylint: disable=g-import-not-at-top
from flax import nnx

from isojax.models import hf_checkpoint
from isojax.sampling import decode
from isojax.bench import datasheets, hf, long_outputs, report, rl_step, roofline, sampling, skew
from isojax.bench import ours as ours_lib
from isojax.bench import timing
from isojax.bench import tunix as tunix_lib
from isojax.bench.options import SECTIONS, Options, check_options
from launch import bench

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = dict(hidden=32, layers=1, heads=2, kv_heads=1, intermediate=64, vocab=64)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  """(options, isojax (graphdef, state), the Hugging Face model) on the same weights."""
  options = Options(**TINY, repeats=1)
  path = str(tmp_path_factory.mktemp("ckpt"))
  ours_lib.write_checkpoint(path, options)
  return options, nnx.split(hf_checkpoint.load_model(path)), hf.load(path)


def test_both_sides_generate_every_token(models):
  options, model, hf_model = models
  g, n, p, t = 2, 3, 5, 4
  result = sampling.bench_sampling(model, hf_model, f"{g}x{n}x{p}x{t}", options,
                                np.random.default_rng(0))
  assert result["isojax"]["tokens"] == g * n * t
  assert result["hf"]["tokens"] == g * n * t
  assert result["tunix"] is None
  prompts = timing.random_prompts(np.random.default_rng(1), g, p, options.vocab)
  rollouts = ours_lib.isojax_sample(model, prompts, n=n, new_tokens=t)
  assert rollouts.tokens.shape == (g * n, t) and bool(rollouts.mask.all())
  assert hf.hf_sample(hf_model, prompts, n=n, new_tokens=t).shape == (g * n, t)


def test_greedy_continuations_agree(models):
  """Temperature 0 against do_sample=False: the weights are the same."""
  options, model, hf_model = models
  prompt = np.array([[5, 17, 3, 42, 9, 11]], np.int32)
  ours = np.asarray(ours_lib.isojax_sample(model, prompt, n=1, new_tokens=12, temperature=0).tokens)
  theirs = hf.hf_sample(hf_model, prompt, n=1, new_tokens=12, do_sample=False)
  np.testing.assert_array_equal(ours, theirs)
  assert hf.same_weights(model, hf_model, options, np.random.default_rng(0))



@pytest.fixture(scope="module")
def tunix_models(tmp_path_factory):
  """(options, isojax (graphdef, state), HF model, Tunix handle) on one checkpoint."""
  pytest.importorskip("tunix")
  options = Options(**TINY, repeats=1)
  path = str(tmp_path_factory.mktemp("tunix_ckpt"))
  ours_lib.write_checkpoint(path, options)
  hf_model = hf.load(path)
  return (options, nnx.split(hf_checkpoint.load_model(path)), hf_model,
          tunix_lib.load(path))


def test_tunix_greedy_equals_isojax(tunix_models):
  """Tunix's Sampler on the same checkpoint: greedy continuations equal isojax's."""
  options, model, _, tunix = tunix_models
  prompts = timing.random_prompts(np.random.default_rng(3), 64, 6, options.vocab)
  ours = np.asarray(ours_lib.isojax_sample(model, prompts, n=1, new_tokens=24,
                                        temperature=0).tokens)
  # Token 0 emitted before the end: Tunix would mask it out of attention were it the pad id.
  assert (ours[:, :-1] == 0).any()
  np.testing.assert_array_equal(tunix_lib.sample(tunix, prompts, 1, 24, temperature=0.0),
                                ours)
  assert tunix_lib.greedy_matches(tunix, prompts[0], ours[0])
  wrong = ours[0].copy()
  wrong[-1] = (wrong[-1] + 1) % options.vocab
  assert not tunix_lib.greedy_matches(tunix, prompts[0], wrong)
  assert tunix_lib.tunix_same_weights(model, tunix, options) is True


def test_tunix_repeats_each_prompt_n_times(tunix_models):
  options, model, hf_model, tunix = tunix_models
  g, n, p, t = 2, 3, 5, 4
  prompts = timing.random_prompts(np.random.default_rng(1), g, p, options.vocab)
  greedy = np.asarray(ours_lib.isojax_sample(model, prompts, n=1, new_tokens=t,
                                          temperature=0).tokens)
  np.testing.assert_array_equal(
      tunix_lib.sample(tunix, prompts, n, t, temperature=0.0), np.repeat(greedy, n, axis=0))
  sampled = tunix_lib.sample(tunix, prompts, n, t)
  assert sampled.shape == (g * n, t) and ((0 <= sampled) & (sampled < options.vocab)).all()
  result = sampling.bench_sampling(model, hf_model, f"{g}x{n}x{p}x{t}", options,
                                np.random.default_rng(0), tunix)
  assert result["tunix"]["tokens"] == result["isojax"]["tokens"] == g * n * t
  assert result["tunix_ratio"] == pytest.approx(float(np.median(
      np.divide(result["tunix"]["times_s"], result["isojax"]["times_s"]))))

def test_timed_rounds_interleave_and_ratios_are_per_round(monkeypatch):
  """Calls go a, b, a, b, ... and the ratio is the median of per-round ratios: a
  machine slowing down 10x mid-measurement leaves it alone, unlike a ratio of medians."""
  clock, calls = [0.0], []
  monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])

  def work(name, seconds):
    def fn():
      calls.append(name)
      clock[0] += seconds * (10 if len(calls) > 4 else 1)   # slows 10x after 4 calls
      return len(calls)
    return fn
  a, b = timing.timed_rounds([work("a", 1.0), work("b", 3.0)], repeats=3)
  assert calls == ["a", "b"] * 4
  assert (a.first_s, b.first_s) == (1.0, 3.0) and (a.out, b.out) == (7, 8)
  assert a.times_s == [1.0, 10.0, 10.0] and b.times_s == [3.0, 30.0, 30.0]
  assert a.median_s == 10.0
  assert timing.round_ratio(a, b) == pytest.approx(3.0)
  assert timing.round_ratio(a, b, work_ratio=0.5) == pytest.approx(1.5)
  # Measured one side after the other (a's calls before the slowdown, b's after), the
  # ratio of medians would have been 30 / 1.
  rate = timing.rate(20, a)
  assert rate["tokens_per_s"] == 2.0 and rate["compile_s"] == 0.0 and rate["times_s"] == a.times_s


def test_slot_waste_by_hand():
  mask = np.zeros((4, 8), bool)
  mask[0, :2] = mask[1, :3] = mask[2, :6] = True   # row 3 empty; the longest row has 6
  waste = skew.slot_waste(mask)
  assert waste["useful_slots"] == 11 and waste["executed_slots"] == 4 * 6
  assert waste["waste_fraction"] == pytest.approx(1 - 11 / 24)


def test_find_skew_prompts():
  tokens = np.array([[1, 1, 1, 1],     # stop id 1 already at slot 0: not short
                     [2, 3, 4, 5],     # short: stop id 3 at slot 1
                     [3, 6, 7, 8],     # contains 3: not long for row 1
                     [9, 9, 9, 9]])
  assert skew.find_skew_prompts(tokens, short_len=2) == (1, 0, 3)
  with pytest.raises(ValueError, match="skew_candidates"):
    skew.find_skew_prompts(np.array([[1, 1], [1, 1]]), short_len=2)


def test_timed_prefill_is_the_prompts_forward(models):
  """The skew section's prefill: its last-token logits are Hugging Face's on the prompts."""
  options, model, hf_model = models
  prompts = timing.random_prompts(np.random.default_rng(2), 3, 7, options.vocab)
  logits, prefix = ours_lib.isojax_prefill(model, prompts)
  with torch.inference_mode():
    theirs = hf_model(torch.as_tensor(prompts, dtype=torch.long)).logits[:, -1].numpy()
  np.testing.assert_allclose(np.asarray(logits), theirs, atol=1e-4, rtol=1e-4)
  assert prefix.mask.shape == (3, 7) and bool(prefix.mask.all())


@pytest.mark.slow("samples a skewed batch with and without continuous batching")
def test_skew_batch_has_short_and_long_rows(models):
  options, model, _ = models
  options = Options(**TINY, repeats=1, skew_rows=10, skew_n=(1, 2), skew_prompt_len=6,
                          skew_new_tokens=16, skew_candidates=32, skew_slots=4,
                          skew_min_slots=1)
  one, two = skew.bench_skew(model, options, np.random.default_rng(0))
  # n = 1: 10 prompts, one of them long; n = 2: 5 prompts, one long (2 rows).
  for result, n, groups, long_rows in ((one, 1, 10, 1), (two, 2, 5, 2)):
    assert (result["n"], result["groups"], result["rows"]) == (n, groups, 10)
    assert result["short_len"] == 2 and result["long_fraction"] == pytest.approx(long_rows / 10)
    # Continuous batching in 4 slots, then 4 halving to 1, decoded the same greedy rollouts.
    assert [(c["slots"], c["min_slots"]) for c in result["continuous"]] == [(4, 0), (4, 1)]
    for cb in result["continuous"]:
      assert cb["same_outputs"] is True
      assert cb["tokens"] == result["useful_slots"]
      assert cb["speedup"] == pytest.approx(
          float(np.median(np.divide(result["times_s"], cb["times_s"]))))
      pre = np.asarray(result["prefill_times_s"])
      assert cb["decode_speedup"] == pytest.approx(float(np.median(
          (np.asarray(result["times_s"]) - pre) / (np.asarray(cb["times_s"]) - pre))))
    assert result["prefill_s"] == pytest.approx(float(np.median(result["prefill_times_s"])))
    assert result["useful_slots"] == (10 - long_rows) * 2 + long_rows * 16
    assert result["executed_slots"] == 10 * 16
    assert result["waste_fraction"] == pytest.approx(
        1 - result["useful_slots"] / result["executed_slots"])


def test_parse_workload_names_the_flag():
  assert timing.parse_workload("32x8x64x64") == (32, 8, 64, 64)
  with pytest.raises(ValueError, match="--workloads entry '32x8x64'"):
    timing.parse_workload("32x8x64")
  with pytest.raises(ValueError, match="--long '4x0x2x2'"):
    timing.parse_workload("4x0x2x2", "--long")


def test_long_outputs_count_every_token_and_agree(models):
  """Both long-output runs generate (counted from their masks) G * n * T tokens and decode
  the same greedy rollouts."""
  options, model, _ = models
  options = Options(**TINY, repeats=1, long="2x2x4x24", long_block=5)
  result = long_outputs.bench_long(model, options, np.random.default_rng(0))
  assert result["whole_cache"]["tokens"] == result["blocked"]["tokens"] == 2 * 2 * 24
  assert result["same_greedy_outputs"] is True


def _numbers(tree, path=""):
  if isinstance(tree, dict):
    for k, v in tree.items():
      yield from _numbers(v, f"{path}.{k}")
  elif isinstance(tree, list):
    for i, v in enumerate(tree):
      yield from _numbers(v, f"{path}[{i}]")
  elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
    yield path, tree


@pytest.mark.slow("runs the benchmarks of launch.bench as a subprocess")
def test_command_writes_the_figures(tmp_path):
  """The default sections but skew, long, roofline and lora, which have tests of their
  own (`test_skew_batch_...`, `test_long_outputs_...`, `test_roofline_...`,
  `test_lora_section_...`)."""
  out = tmp_path / "bench.json"
  args = [sys.executable, "-m", "launch.bench", *(f"--{k}={v}" for k, v in TINY.items()),
          "--workloads=2x2x8x4", "--share_n=1,2", "--share_rollouts=4", "--share_prompt_len=8",
          "--share_new_tokens=4", "--skew_rows=10", "--skew_n=2", "--skew_prompt_len=8",
          "--skew_new_tokens=16", "--skew_candidates=32", "--update_batch=4",
          "--update_seq_len=12", "--update_prompt_len=8", "--matmul_size=64", "--repeats=1",
          "--rl_steps=0", "--long=2x2x4x16", "--long_block=4",
          "--sections=sampling,sharing,update,rl_step", f"--out={out}"]
  proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "isojax/HF" in proc.stdout and "tunix: " in proc.stdout
  result = json.loads(out.read_text())
  assert {"options", "params", "same_weights", "sampling", "sharing", "update"} <= set(result)
  assert all(result[k] is None for k in ("skew", "long", "roofline", "lora"))  # not asked for
  assert result["same_weights"] is True
  (sampling,) = result["sampling"]
  assert sampling["isojax"]["tokens"] == sampling["hf"]["tokens"] == 2 * 2 * 4
  if result["tunix_same_weights"] is None:   # Tunix not installed: null figures
    assert sampling["tunix"] is None and sampling["tunix_ratio"] is None
  else:
    assert result["tunix_same_weights"] is True and sampling["tunix"]["tokens"] == 2 * 2 * 4
  assert [row["n"] for row in result["sharing"]] == [1, 2]
  first, second = result["sharing"]
  assert first["vs_first"] == 1.0 and second["vs_first"] == pytest.approx(
      float(np.median(np.divide(first["times_s"], second["times_s"]))))
  u = result["update"]
  assert u["fraction_of_peak"] == pytest.approx(float(np.median(
      [u["flops"] / t / p for t, p in zip(u["times_s"], u["matmul_peaks"])])))
  assert {"tokens_per_s", "flops_per_s", "matmul_peak_flops_per_s",
          "fraction_of_peak"} <= set(result["update"])
  assert u["device_kind"] == "cpu" and u["mfu"] is None  # no datasheet for a CPU
  for path, value in _numbers(result):
    assert math.isfinite(value), path
    if path.endswith(("tokens_per_s", "median_s", "flops_per_s", "tokens", "slots")) and (
        not path.endswith("min_slots")):   # min_slots: 0 means no halving
      assert value > 0, path
  assert result["update"]["flops"] == 6 * (result["params"]["body"] * 4 * 12
                                           + result["params"]["head"] * 4 * 4)


def test_rl_step_breakdown_averages_the_phases_after_warmup():
  def line(step, sample, wait, update, other, **extra):
    return {"step": step, "time/sample_s": sample, "time/grade_wait_s": wait,
            "time/update_s": update, "time/other_s": other, "time/decode_s": 0.01,
            "time/grade_s": 0.02, "time/step_s": sample + wait + update + other, **extra}
  lines = [{"step": 0}, line(1, 9.0, 9.0, 9.0, 9.0), line(2, 0.2, 0.1, 0.6, 0.1),
           line(3, 0.4, 0.0, 0.4, 0.2, **{"time/eval_s": 3.0})]
  b = rl_step.summarize(lines, warmup=1, rollouts_per_step=64)
  assert b["steps"] == 2 and b["step_s"] == pytest.approx(1.0)
  assert b["seconds"]["sample"] == pytest.approx(0.3)
  assert b["shares"] == pytest.approx({"sample": 0.3, "grade_wait": 0.05, "update": 0.5,
                                       "other": 0.15})
  assert b["host_share"] == pytest.approx(0.2) and b["eval_s"] == 3.0
  text = "\n".join(rl_step.format_breakdown(b, "test"))
  assert "1000 ms per step" in text and "host share of the step (grade_wait + other): 20.0%" in text
  with pytest.raises(ValueError, match="warmup=3"):
    rl_step.summarize(lines, warmup=3, rollouts_per_step=64)


def test_roofline_counts_the_bytes_of_real_caches_and_weights(models):
  """Bytes per decode step against the arrays themselves: the HF model's parameters
  (less the embedding table, plus the rows a step gathers from it), the prompt cache
  `decode.prefill` builds for G prompts and the generated cache `decode.init_cache` builds for
  G * n rows of T slots."""
  options, model, hf_model = models
  g, n, p, t = 2, 3, 5, 4
  options = Options(**TINY, repeats=2, bandwidth_bytes=2**16)
  result = roofline.bench_decode_roofline(model, ours_lib.param_counts(model), f"{g}x{n}x{p}x{t}",
                                       options, np.random.default_rng(0), tied=False)
  transformer = nnx.merge(*model)
  _, prefix = decode.prefill(transformer, np.ones((g, p), np.int32), np.ones((g, p), bool))
  generated = decode.init_cache(transformer, g * n, t)
  params = {name: x.detach().numpy().nbytes for name, x in hf_model.named_parameters()}
  embed = params["model.embed_tokens.weight"]
  want = dict(weights=sum(params.values()) - embed + g * n * embed // options.vocab,
              prefix_cache=sum(c.nbytes for c in prefix.k + prefix.v),
              generated_cache=sum(c.nbytes for c in jax.tree.leaves(generated)))
  want["total"] = sum(want.values())
  assert result["bytes_per_step"] == want
  assert result["bytes_per_s"] == pytest.approx(want["total"] / result["step_s"])
  assert result["fraction_of_copy"] == pytest.approx(float(np.median(
      [want["total"] / s / c for s, c in zip(result["steps_s"], result["copy_peaks"])])))
  assert len(result["steps_s"]) == len(result["copy_peaks"]) == 2
  assert result["device_kind"] == "cpu" and result["fraction_of_nominal"] is None
  # Tied: the LM head reads the whole table, so nothing is taken off.
  tied = roofline.decode_bytes(
      weight_bytes=100, embed_bytes=40, tied=True, rows=3, groups=1, hidden=2, layers=1,
      kv_heads=1, head_dim=1, prompt_len=0, cache_len=0, cache_itemsize=4, weight_itemsize=4)
  assert tied["weights"] == 100 and tied["total"] == 100


def test_roofline_step_time_and_nominal_bandwidth():
  # Rounds of (T = 9, T = 1) calls: 2.0 s vs 0.4 s and 3.0 vs 1.0 -> 0.2 and 0.25 s a step.
  assert roofline.step_seconds([2.0, 3.0, 2.6], [0.4, 1.0, 0.2], 9) == pytest.approx(0.25)
  with pytest.raises(ValueError, match="T=1"):
    roofline.step_seconds([1.0], [1.0], 1)
  assert datasheets.nominal_bandwidth("NVIDIA H100 PCIe") == 2.0e12
  assert datasheets.nominal_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
  assert datasheets.nominal_bandwidth("NVIDIA H200") == 4.8e12
  assert datasheets.nominal_bandwidth("cpu") is None
  assert datasheets.nominal_flops("NVIDIA H100 80GB HBM3") == 989.4e12
  assert datasheets.nominal_flops("NVIDIA H100 PCIe") == 756e12
  assert datasheets.nominal_flops("TPU v5 lite") == 197e12
  assert datasheets.nominal_flops("TPU v5p") == 459e12
  assert datasheets.nominal_flops("cpu") is None
  # The copy-bandwidth callable counts a read and a write of the array.
  assert roofline.copy_bandwidth(2**20, calls=1)() > 0


@pytest.mark.parametrize("field,value,message", [
    ("sections", ("sampling", "bogus"), "--sections=sampling,bogus: expected a non-empty list"),
    ("sections", (), "--sections=: expected a non-empty list"),
    ("roofline", ("2x2x4x4", "2x2x4x1"), "--roofline entry '2x2x4x1': expected T >= 2"),
    ("roofline", ("2x2x4",), "--roofline entry '2x2x4': expected GxNxPxT"),
    ("roofline", (), "--roofline=: expected at least one workload"),
    ("roofline_dtype", "float16", "--roofline_dtype='float16': expected float32 or bfloat16"),
    ("bandwidth_bytes", 2, "--bandwidth_bytes=2: expected at least 4"),
    ("long_block", -1, "--long_block=-1"),
    ("workloads", ("4x4",), "--workloads entry '4x4'"),
    ("skew_n", (1, 3), "--skew_n=1,3: expected positive divisors of --skew_rows=256"),
    ("skew_n", (), "--skew_n=: expected positive divisors"),
    ("slots_levels", ("0:0", "64"), "--slots_levels entry '64': expected SLOTS:MIN"),
    ("slots_levels", ("0:8",), "--slots_levels entry '0:8': a minimum needs slots"),
    ("slots_levels", (), "--slots_levels=: expected at least one SLOTS:MIN level"),
    ("slots_n", (2, 0), "--slots_n=2,0: expected positive integers"),
])
def test_bad_options_name_their_flag(field, value, message):
  check_options(Options())   # the defaults pass
  with pytest.raises(ValueError, match=re.escape(message)):
    check_options(Options(**{field: value}))


def test_bad_flag_fails_before_anything_is_built(tmp_path):
  proc = subprocess.run([sys.executable, "-m", "launch.bench", "--roofline=2x2x4x1",
                         f"--out={tmp_path}/x.json"], cwd=REPO, capture_output=True, text=True,
                        timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode != 0 and "--roofline entry '2x2x4x1': expected T >= 2" in proc.stderr
  assert "model:" not in proc.stdout and not (tmp_path / "x.json").exists()


def test_sections_pick_what_runs():
  options = Options(**TINY, repeats=1, roofline=("1x2x4x3", "2x1x4x3"),
                          bandwidth_bytes=2**16, sections=("roofline",))
  result = bench.run(options)
  assert [f["rows"] for f in result["roofline"]] == [2, 2]
  assert [f["workload"] for f in result["roofline"]] == ["1x2x4x3", "2x1x4x3"]
  for name in set(SECTIONS) - {"roofline"}:
    assert result[name] is None, name
  text = report.format_table(result)
  assert "decode roofline: isojax, 2x1x4x3" in text
  assert "sampling:" not in text and "update:" not in text


def test_fastest_rate_takes_the_fastest_call(monkeypatch):
  clock, durations = [0.0], iter([3.0, 1.0, 2.0])
  monkeypatch.setattr(roofline.time, "perf_counter", lambda: clock[0])

  def call():
    clock[0] += next(durations)
  assert roofline.fastest_rate(call, work=10.0, calls=3) == 10.0


def test_lora_section_times_the_adapted_model_against_its_merged_weights():
  """The adapted and merged models are the same function (their greedy tokens agree
  here); the ratio is the per-round median of merged / adapted seconds."""
  options = Options(**TINY, repeats=2, lora_rank=4, lora_workload="2x2x4x6",
                    sections=("lora",))
  result = bench.run(options)
  f = result["lora"]
  assert f["adapted"]["tokens"] == f["merged"]["tokens"] == 2 * 2 * 6
  assert f["ratio"] == pytest.approx(float(np.median(
      np.divide(f["merged"]["times_s"], f["adapted"]["times_s"]))))
  assert f["greedy_tokens_equal"] == 1.0
  assert "adapted at" in report.format_table(result)
  with pytest.raises(ValueError, match=r"--lora_rank=64: expected in \[1, 32\]"):
    check_options(Options(**TINY, lora_rank=64))


def test_trl_comparison_summary_leaves_out_each_processes_first_step():
  from isojax.bench import trl_step  # pylint: disable=g-import-not-at-top
  runs = [dict(generate_s=[9.0, 1.0, 2.0], step_s=[30.0, 4.0, 6.0], tokens=[5, 100, 300],
               reward=[0.1, 0.2, 0.3], peak_rss_gib=3.0),
          dict(generate_s=[8.0, 3.0, 2.0], step_s=[20.0, 5.0, 5.0], tokens=[5, 200, 200],
               reward=[0.3, 0.4, 0.5], peak_rss_gib=4.5)]
  s = trl_step.summarize(runs)
  assert s["steps"] == 4
  assert s["step_s"] == pytest.approx((4 + 6 + 5 + 5) / 4)
  assert s["generate_s"] == pytest.approx((1 + 2 + 3 + 2) / 4)
  assert s["update_s"] == pytest.approx((3 + 4 + 2 + 3) / 4)
  assert s["tokens_per_s"] == pytest.approx(800 / 8)
  assert s["peak_rss_gib"] == 4.5
  assert s["reward"] == pytest.approx([0.2, 0.3, 0.4])   # per step, over the processes


def test_the_update_line_gives_mfu_against_the_cards_datasheet_where_known():
  """On an accelerator the update's model FLOP/s over the datasheet bfloat16 peak of its
  `device_kind` (`bench.datasheets`); a CPU's line has none."""
  u = dict(batch=2, seq_len=8, prompt_len=4, tokens_per_s=100.0, flops_per_s=2.5e14,
           matmul_peak_flops_per_s=5e14, fraction_of_peak=0.5,
           device_kind="NVIDIA H100 80GB HBM3",
           mfu=2.5e14 / datasheets.nominal_flops("NVIDIA H100 80GB HBM3"))
  line = report._update_lines(dict(update=u), dict(matmul_size=64))[1]
  assert line.endswith("; 25.3% of the NVIDIA H100 80GB HBM3's datasheet bfloat16 peak (MFU)")
  cpu = report._update_lines(dict(update=dict(u, device_kind="cpu", mfu=None)),
                             dict(matmul_size=64))[1]
  assert "MFU" not in cpu


@pytest.mark.slow("compiles the micro config's sampler at two slot levels")
def test_slots_section_times_the_calls_a_run_makes():
  """The evaluation chunk and a step's sampling of configs/hard.py:micro at each level:
  the replies it reports are those of `evaluation.correct_counts` called here directly
  on the config's problems, with each level's sampler and the round's key."""
  from isojax import configs  # pylint: disable=g-import-not-at-top
  from isojax.config import config_lib  # pylint: disable=g-import-not-at-top
  from isojax.run import evaluation, run_inputs  # pylint: disable=g-import-not-at-top
  spec = "configs/hard.py:micro"
  result = bench.run(Options(sections=("slots",), slots_config=spec, repeats=1,
                             slots_levels=("0:0", "8:2"), slots_n=(2,)))
  assert "params" not in result   # a real run's model: no random checkpoint built
  for name in set(SECTIONS) - {"slots"}:
    assert result[name] is None, name
  r = result["slots"]
  s = config_lib.as_settings(configs.load(spec))
  g, n_eval = s.eval.chunk_problems, s.eval.num_samples
  assert [c["rollouts"] for c in r["calls"]] == [g * n_eval, s.problems_per_batch * 2]
  inputs = run_inputs.check_inputs(s)
  graphdef, params = nnx.split(hf_checkpoint.load_model(inputs.path, inputs.mesh))
  for call, (problems, n, chunk) in zip(r["calls"], [
      (inputs.val_problems[:g], n_eval, g),
      (inputs.train_problems[:s.problems_per_batch], 2, s.problems_per_batch)]):
    for level in call["levels"]:
      sampling = dataclasses.replace(inputs.settings.sampling, decode_slots=level["slots"],
                                     decode_slots_min=level["min_slots"])
      counts = evaluation.correct_counts(graphdef, params, inputs.tok, inputs.book, problems,
                                         inputs.verifier, num_samples=n, chunk=chunk,
                                         rng=jax.random.fold_in(jax.random.key(0), 1),
                                         sampling=sampling)   # the one round's key
      assert level["correct"] == counts.correct_G.sum()
      assert level["mean_len"] == pytest.approx(counts.lengths_GN.mean())
      assert level["max_len"] == counts.lengths_GN.max()
      assert level["truncated"] == pytest.approx(counts.truncated_GN.mean())
      assert level["median_s"] > 0 and level["first_s"] > 0
    assert call["levels"][0]["speedup"] == 1.0
  text = report.format_table(result)
  assert "| 0:0 s (x) | 8:2 s (x) |" in text
  assert f"| evaluation chunk: {g} validation problems x {n_eval} | {g * n_eval} |" in text
