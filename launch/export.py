r"""Exports a run's trained policy as a Hugging Face checkpoint, or its LoRA adapters.

  python -m launch.export --workdir=/tmp/isojax/lora --out=/tmp/policy
  python -m launch.export --workdir=/tmp/isojax/lora --out=/tmp/adapter --format=peft
  python -m launch.export --workdir=/tmp/isojax/hard --out=/tmp/policy --step=100

Reads the run's config.json, loads its base policy (`base_model.path` or the shipped
demo base) and restores the parameters of checkpoint --step (default: the newest).
`--format=hf` writes config.json, model.safetensors and the base's tokenizer files,
which `transformers.AutoModelForCausalLM.from_pretrained` loads (a LoRA run's adapters
merged into the weights: W + A @ B * alpha / rank). `--format=peft` writes the adapters
alone in PEFT's layout (`peft.PeftModel.from_pretrained(base, OUT)`): LoRA runs only.
"""

from __future__ import annotations

from absl import app, flags

from isojax import export
from isojax.models import lora

_WORKDIR = flags.DEFINE_string("workdir", None, "The run directory.", required=True)
_OUT = flags.DEFINE_string("out", None, "The directory to write.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest).")
_FORMAT = flags.DEFINE_enum("format", "hf", ["hf", "peft"], "hf: a merged Hugging Face "
                            "checkpoint; peft: LoRA adapters in PEFT's layout.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  try:
    model, base_path, step = export.restored_policy(_WORKDIR.value, _STEP.value)
  except (ValueError, FileNotFoundError) as e:
    raise SystemExit(f"launch.export: error: {e}") from None
  out = _OUT.value
  if _FORMAT.value == "peft":
    if not model.cfg.lora.enabled:
      raise SystemExit(f"launch.export: error: --format=peft: the run in {_WORKDIR.value} "
                       "has no LoRA adapters (model.lora.rank=0); use --format=hf")
    lora.save_peft(model, out, base_model_name_or_path=base_path)
  else:
    export.save_hf(model, base_path, out)
  print(f"wrote {out} ({_FORMAT.value}) from step {step} of {_WORKDIR.value}")


if __name__ == "__main__":
  app.run(main)
