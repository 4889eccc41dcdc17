"""Benchmarks behind `launch.bench`, one module per section.

  timing        interleaved rounds, per-round ratios, workload strings
  options       the benchmark's options and their validation
  ours          isojax's side: a random-weight checkpoint, sampling and prefill calls
  hf            Hugging Face `generate` (the only module that imports torch)
  tunix         Google Tunix's vanilla sampler, when installed
  sampling      tokens/s against HF and Tunix; the shared prompt cache at several n
  skew          length-skewed batches: lockstep against continuous batching
  long_outputs  whole-cache against blocked attention at long outputs
  train_step    the update's tokens/s and fraction of a measured matmul peak
  rl_step       where the time of an RL step goes
  roofline      decode against the memory-bandwidth roofline
  trl_step      the whole RL step against TRL's GRPOTrainer (and Tunix's) on a real model
  tunix_step    Tunix's GRPO learner as a side of that comparison
  report        the figures as a text table
"""
