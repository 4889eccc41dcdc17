"""The benchmark's figures as a compact text table."""

from __future__ import annotations

from isojax.bench import rl_step
from isojax.bench.options import REAL_MODEL_SECTIONS


def _sampling_lines(r: dict, o: dict) -> list[str]:
  lines = [f"sampling: tokens/s, median of {o['repeats']} rounds (each side called once per "
           "round, in turn), compile excluded; ratios: median of per-round ratios",
           f"{'G x n x P x T':<18}{'isojax':>10}{'HF':>10}{'isojax/HF':>11}{'tunix':>8}"
           f"{'isojax/tunix':>14}{'compile s':>11}"]
  for s in r["sampling"]:
    tx = s.get("tunix")
    tunix = (f"{tx['tokens_per_s']:>8.0f}{s['tunix_ratio']:>13.2f}x" if tx
             else f"{'n/a':>8}{'n/a':>14}")
    lines.append(f"{s['workload']:<18}{s['isojax']['tokens_per_s']:>10.0f}"
                 f"{s['hf']['tokens_per_s']:>10.0f}{s['ratio']:>10.2f}x{tunix}"
                 f"{s['isojax']['compile_s']:>11.1f}")
  return lines


def _sharing_lines(r: dict, o: dict) -> list[str]:
  sh = r["sharing"]
  return ([f"shared prompt cache: isojax, {o['share_rollouts']} rollouts, "
           f"P={o['share_prompt_len']}, T={o['share_new_tokens']}",
           f"{'n':>4}{'G':>5}{'tokens/s':>10}{'vs n=' + str(sh[0]['n']):>9}"]
          + [f"{x['n']:>4}{x['groups']:>5}{x['tokens_per_s']:>10.0f}{x['vs_first']:>8.2f}x"
             for x in sh])


def _skew_lines(r: dict, o: dict) -> list[str]:
  return [line for k in r["skew"] for line in _skew_batch_lines(k)]


def _skew_batch_lines(k: dict) -> list[str]:
  lines = [f"length skew: isojax greedy, {k['rows']} rows = {k['groups']} prompts x n="
           f"{k['n']}, P={k['prompt_len']}, T={k['new_tokens']}; "
           f"{100 * (1 - k['long_fraction']):.0f}% stop after {k['short_len']} tokens, "
           f"{100 * k['long_fraction']:.0f}% run to {k['new_tokens']}",
           f"  lockstep: decode slots useful / executed: {k['useful_slots']} / "
           f"{k['executed_slots']} -> waste {100 * k['waste_fraction']:.1f}%",
           f"  lockstep wall {k['median_s']:.2f} s ({k['tokens_per_s']:.0f} useful tokens/s); "
           f"at the dense rate ({k['full_batch_tokens_per_s']:.0f} tokens/s) the useful "
           f"tokens would take {k['ideal_s']:.2f} s"]
  for cb in k["continuous"]:
    halving = f" halving down to {cb['min_slots']}" if cb["min_slots"] else ""
    lines.append(f"  continuous batching, {cb['slots']} slots{halving}: wall "
                 f"{cb['median_s']:.2f} s ({cb['tokens_per_s']:.0f} useful tokens/s) -> "
                 f"{cb['speedup']:.2f}x lockstep; same greedy outputs: {cb['same_outputs']}")
  lines.append(f"  the prefill of the {k['groups']} prompts, in both sides' wall: "
               f"{k['prefill_s']:.2f} s; without it, decoding alone -> "
               + ", ".join(f"{cb['decode_speedup']:.2f}x" for cb in k["continuous"])
               + " lockstep (same order)")
  return lines


def _long_lines(r: dict, o: dict) -> list[str]:
  lg = r["long"]
  return [f"long outputs: isojax, {lg['workload']} (G x n x P x T), temperature 1, every "
          "rollout to T", f"  whole cache every step {lg['whole_cache']['tokens_per_s']:.0f} "
          f"tokens/s; blocked (decode_block={lg['block']}) {lg['blocked']['tokens_per_s']:.0f} "
          f"tokens/s -> {lg['speedup']:.2f}x; same greedy outputs: {lg['same_greedy_outputs']}"]


def _update_lines(r: dict, o: dict) -> list[str]:
  u = r["update"]
  return [f"update: train_step, {u['batch']} x {u['seq_len']} tokens "
          f"(P={u['prompt_len']}), FLOPs = 6 * (body params * B * S + head params * B * T)",
          f"  {u['tokens_per_s']:.0f} tokens/s, {u['flops_per_s'] / 1e9:.1f} GFLOP/s; "
          f"float32 {o['matmul_size']}^2 matmul peak {u['matmul_peak_flops_per_s'] / 1e9:.1f}"
          f" GFLOP/s (best of 5 calls before each step) -> {100 * u['fraction_of_peak']:.1f}%"
          " of peak (median of per-round fractions)"
          + ("" if u.get("mfu") is None else f"; {100 * u['mfu']:.1f}% of the "
             f"{u['device_kind']}'s datasheet bfloat16 peak (MFU)")] + _profile_lines(u)


def _profile_lines(u: dict) -> list[str]:
  """One traced update's seconds by kind, and the matmul kernels' own rate."""
  prof = u.get("profile")
  if not prof:
    return []
  seconds = prof["seconds"]
  total = sum(seconds.values()) or 1.0
  line = "  traced step: " + ", ".join(f"{k} {v:.2f} s ({100 * v / total:.0f}%)"
                                       for k, v in seconds.items())
  if prof["matmul_flops_per_s"]:
    line += (f"; the model FLOPs over the matmul seconds: "
             f"{prof['matmul_flops_per_s'] / 1e9:.1f} GFLOP/s, "
             f"{100 * prof['matmul_flops_per_s'] / u['matmul_peak_flops_per_s']:.0f}% of "
             "the matmul peak")
  return [line]


def _rl_step_lines(r: dict, o: dict) -> list[str]:
  return rl_step.format_breakdown(r["rl_step"], "configs/hard.py (the default)")


def _roofline_lines(r: dict, o: dict) -> list[str]:
  return [line for f in r["roofline"] for line in _roofline_workload_lines(f, o)]


def _roofline_workload_lines(f: dict, o: dict) -> list[str]:
  read = f["bytes_per_step"]
  nominal = ("no nominal figure for this device" if f["nominal_bytes_per_s"] is None else
             f"nominal {f['nominal_bytes_per_s'] / 1e9:.0f} GB/s -> "
             f"{100 * f['fraction_of_nominal']:.1f}% of it")
  return [f"decode roofline: isojax, {f['workload']} (G x n x P x T), {f['dtype']}, "
          f"{f['rows']} rows, on {f['device_kind']}",
          f"  bytes read per step {read['total'] / 2**20:.1f} MiB (weights "
          f"{read['weights'] / 2**20:.1f}, prompt cache {read['prefix_cache'] / 2**20:.1f}, "
          f"generated cache {read['generated_cache'] / 2**20:.1f}); step "
          f"{1e3 * f['step_s']:.2f} ms -> {f['bytes_per_s'] / 1e9:.1f} GB/s",
          f"  measured copy bandwidth (x * 2 over {o['bandwidth_bytes'] / 2**20:.0f} MiB, best "
          f"of 5 before each round) {f['copy_bytes_per_s'] / 1e9:.1f} GB/s -> "
          f"{100 * f['fraction_of_copy']:.1f}% of it; {nominal}"]



def _lora_lines(r: dict, o: dict) -> list[str]:
  f = r["lora"]
  return [f"LoRA sampling: isojax, {f['workload']} (G x n x P x T), rank {f['rank']} on every "
          "projection, temperature 1",
          f"  adapted {f['adapted']['tokens_per_s']:.0f} tokens/s; merged weights "
          f"{f['merged']['tokens_per_s']:.0f} tokens/s -> adapted at {f['ratio']:.2f}x the "
          f"merged rate; greedy tokens equal: {100 * f['greedy_tokens_equal']:.1f}%"]


def trl_table(r: dict) -> list[str]:
  """The per-step table of `trl_step.compare`, and the load times."""
  lines = ["| side | step s | generation s | update s | generated tokens/s | peak RSS GiB |",
           "|---|---|---|---|---|---|"]
  for side in ("isojax", "trl", "tunix"):
    if side not in r:   # no Tunix side unless asked for
      continue
    s = r[side]
    lines.append(f"| {side} | {s['step_s']:.1f} | {s['generate_s']:.1f} | {s['update_s']:.1f} "
                 f"| {s['tokens_per_s']:.0f} | {s['peak_rss_gib']:.2f} |")
  ratios = [f"{name} {r[key]:.2f}x" for name, key in (("TRL", "trl_over_isojax_step"),
                                                        ("Tunix", "tunix_over_isojax_step"))
            if key in r]
  lines += ["", "Step time over isojax's: " + ", ".join(ratios) + "."]
  load = r["load_s"]
  lines += ["", f"Loading the GGUF file (model and tokenizer, median of the rounds, each in a "
            f"fresh process): isojax {load['isojax']:.1f} s, transformers "
            f"{load['transformers']:.1f} s."]
  return lines


def _trl_lines(r, _):
  t = r["trl"]
  return ([f"RL step against TRL {t['versions']['trl']} (torch {t['versions']['torch']}, "
           f"{t['versions']['torch_threads']} threads) on {t['config']}: {t['rounds']} rounds "
           f"of {t['steps']} steps per side, the first of each left out; TRL / isojax step "
           f"time {t['trl_over_isojax_step']:.2f}x"
           + (f"; Tunix {t['versions']['tunix']} (GRPOLearner, vanilla rollout) / isojax "
              f"{t['tunix_over_isojax_step']:.2f}x" if "tunix" in t else "")]
          + trl_table(t))


def slots_table(r: dict) -> list[str]:
  """The comparison as a markdown table: seconds per call and level, speedups."""
  levels = [f"{lv['slots']}:{lv['min_slots']}" for lv in r["calls"][0]["levels"]]
  head = " | ".join(f"{lv} s (x)" for lv in levels)
  lines = [f"Lockstep (0:0) against continuous batching (decode_slots:decode_slots_min) on "
           f"{r['config']} ({r['model']}), up to {r['max_new_tokens']} new tokens at "
           f"temperature {r['temperature']}; median of {r['repeats']} round(s), (x) the "
           "speedup over the first level:", "",
           f"| call | rollouts | {head} | mean / longest reply, cut |",
           "|---|---|" + "---|" * len(levels) + "---|"]
  for row in r["calls"]:
    cells = " | ".join(f"{lv['median_s']:.2f} ({lv['speedup']:.2f}x)" for lv in row["levels"])
    replies = "; ".join(f"{lv['mean_len']:.1f} / {lv['max_len']}, {100 * lv['truncated']:.1f}%"
                        for lv in row["levels"])
    lines.append(f"| {row['call']} | {row['rollouts']} | {cells} | {replies} |")
  return lines


def _slots_lines(r, _):
  return slots_table(r["slots"])


_SECTION_LINES = dict(sampling=_sampling_lines, sharing=_sharing_lines, skew=_skew_lines,
                      long=_long_lines, update=_update_lines, rl_step=_rl_step_lines,
                      roofline=_roofline_lines, lora=_lora_lines, trl=_trl_lines,
                      slots=_slots_lines)


def format_table(r: dict) -> str:
  """The figures of `run` as a compact text table (the sections that ran)."""
  if "params" not in r:   # real-model sections alone (trl, slots): no random checkpoint
    return "\n\n".join("\n".join(_SECTION_LINES[name](r, None))
                       for name in REAL_MODEL_SECTIONS if r.get(name))
  o, c = r["options"], r["params"]
  tunix_same = "n/a" if r.get("tunix_same_weights") is None else r["tunix_same_weights"]
  hf = ("HF not measured" if r["torch"] is None else
        f"torch {r['torch']} ({r['torch_threads']} threads"
        f"{'' if r['torch_device'] == 'cpu' else ', HF on ' + r['torch_device']})")
  same = "n/a" if r.get("same_weights") is None else r["same_weights"]
  lines = [f"model: Qwen2-shaped, random weights, {sum(c.values()) / 1e6:.1f}M params "
           f"(hidden {o['hidden']}, {o['layers']} layers, {o['heads']} heads, {o['kv_heads']} kv "
           f"heads, mlp {o['intermediate']}, vocab {o['vocab']}), float32; same weights: "
           f"{same} (tunix: {tunix_same}); jax {r['jax']} ({r['backend']}), {hf}, "
           f"{r['cpu_count']} CPUs"]
  for name, section in _SECTION_LINES.items():
    if r.get(name):
      lines += [""] + section(r, o)
  return "\n".join(lines)
