"""A results file: the header that says what made it, and its write; and its figures.

Every file under docs/results/ opens with the command that wrote it, the commit, the
machine (CPU model, XLA:CPU instruction set), the jax version, the date and the wall
time, so a number in it can be traced to what produced it; it is replaced whole, never
edited in place. Its figures (docs/results/img/) are drawn on a `figure` and written by
`save_figure`: matplotlib's object API, so a section run from a notebook leaves its
pyplot state and backend alone.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import subprocess
from typing import Any

from matplotlib.figure import Figure

from isojax import cpu_isa
from isojax.planner import plots


@dataclasses.dataclass(frozen=True)
class Invocation:
  """One invocation of the reproduce command."""
  out: str       # where the runs go (reused: rerunning resumes)
  results: str   # where the tables and plots are written (docs/results)
  repo: str      # the checkout the runs start in, whose commit each header names
  command: str   # the command line each header quotes


def environment(repo: str) -> dict[str, Any]:
  """Commit, machine and software that a table's numbers come from."""
  def git(*args):
    try:
      return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                            check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
      return ""
  import jax  # pylint: disable=g-import-not-at-top
  # A copy of a commit's files whose .git is not that commit's (a remote accelerator
  # machine) names the commit in ISOJAX_COMMIT.
  named = os.environ.get("ISOJAX_COMMIT", "")[:12]
  return dict(commit=named or git("rev-parse", "--short=12", "HEAD") or "unknown",
              # The results being written are no uncommitted change of the code.
              dirty=not named and bool(git("status", "--porcelain", "--untracked-files=no",
                                           "--", ".", ":(exclude)docs/results")),
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


def write(inv: Invocation, name: str, title: str, wall_s: float, body: str) -> str:
  """Writes results/<name>: the header, then `body`; returns its path."""
  os.makedirs(inv.results, exist_ok=True)
  path = os.path.join(inv.results, name)
  text = header(title, inv.command, environment(inv.repo), wall_s) + "\n" + body
  with open(path + ".tmp", "w") as f:
    f.write(text)
  os.replace(path + ".tmp", path)  # a rerun replaces the table whole
  print(f"wrote {path}")
  return path


def figure(figsize: tuple[float, float], **subplots: Any) -> tuple[Figure, Any]:
  """(a matplotlib Figure of `figsize` inches, its axes from `Figure.subplots(**subplots)`),
  outside pyplot's figure registry."""
  fig = Figure(figsize=figsize)
  return fig, fig.subplots(**subplots)


def save_figure(fig: Figure, path: str) -> None:
  """`fig`, laid out tight, as an image at `path` (its folder made), as the sweep
  analysis writes its own (`plots.save`: the same resolution)."""
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  plots.save(fig, path)
