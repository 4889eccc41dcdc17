r"""Does one RL step fit in a pod's HBM? Compiles it for the pod on a CPU-only machine.

  pip install "jax[tpu]==0.10.2"   # libtpu for the TPU topologies (or: pip install -e ".[aot]")
  python -m launch.aot --config=configs/hard.py:paper --model=qwen2.5-7b --topology=v5p-64
  python -m launch.aot --config=configs/hard.py:paper --model=qwen2.5-7b --topology=v5p-64 \
      --config.rl.micro_batch_size=32 --config.rl.logprob_chunk_size=512
  python -m launch.aot --config=configs/hard.py:micro --topology=cpu:8 --hbm_gib=1

What is compiled and how it is measured: `isojax.aot`.
"""

from __future__ import annotations

from absl import app, flags, logging
from ml_collections import config_flags

from isojax import command_line, topology
from isojax.aot import HF_CONFIGS, check, format_table, model_config, overflows
from isojax.config import config_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "configs/hard.py", "Run config (file.py[:preset]).", lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", "v5p-64", "v5p-64 | v5p-128 | v5e-256 | v5e-8 | "
                                "v6e-8 (2x... for two slices) | cpu:N (N fake CPU devices).")
_MODEL = flags.DEFINE_string("model", None, f"Known model shapes: {sorted(HF_CONFIGS)}; "
                             "default: base_model.path/config.json.")
_PROMPT_LEN = flags.DEFINE_integer("prompt_len", 512, "Prompt slots P of a batch.")
_HBM_GIB = flags.DEFINE_float("hbm_gib", None, "Per-chip memory budget in GiB (default: "
                              "the chip's HBM; unknown for cpu:N).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.INFO)
  name = _TOPOLOGY.value
  try:
    topology.prepare_backend(name)
    devices = topology.devices(name)
    s = config_lib.settings(config_lib.resolve(_CONFIG.value))  # the ConfigDict ends here
    model_cfg = model_config(s, _MODEL.value)
    print(f"{name}: {len(devices)} x {devices[0].device_kind}; model of "
          f"{model_cfg.num_layers} layers, width {model_cfg.embed_dim}, vocabulary "
          f"{model_cfg.vocab_size}", flush=True)
    results = check(s, devices, model_cfg, _PROMPT_LEN.value)
  except ValueError as e:
    raise SystemExit(f"launch.aot: error: {e}") from None
  hbm = topology.hbm_bytes(devices, _HBM_GIB.value)
  print(format_table(results, hbm))
  failures = overflows(results, hbm)
  if failures:
    raise SystemExit("launch.aot: does not fit:\n  " + "\n  ".join(failures))


if __name__ == "__main__":
  app.run(main, flags_parser=command_line.parse_flags)
