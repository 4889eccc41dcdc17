"""Where a compiled CPU program spends its time, by kind of operation.

`jax.profiler` traces XLA:CPU's thunks as events named after the HLO instruction they
run (`dot.64`, `ynn_fusion.41`, `copy_bitcast_fusion.5`, ...). `kinds` reads the
compiled program's HLO text to learn what each instruction is, and sums the traced
seconds of every executed instruction by kind:

  matmul     a dot or convolution, or a fusion whose computation holds one (XLA:CPU's
             YNNPACK fusions, `ynn_fusion.*`, are dots with their operands' fusions);
  data move  copies, transposes, slices, dynamic(-update) slices, concatenates, pads;
  other      every other fusion and instruction (elementwise, reductions, scatter);
the loop and call instructions that contain others (`while`, `call`, `conditional`)
are left out, so no second counts twice. With the model FLOPs of the traced call, the
matmul seconds give the rate the matmul kernels themselves reach at the model's
shapes, beside the whole call's.
"""

from __future__ import annotations

import collections
import glob
import os
import re
from typing import Any, Callable

import jax

_CALLS = re.compile(r"calls=%?([\w.\-]+)")
MATMUL_OPS = frozenset({"dot", "convolution"})
MOVE_OPS = frozenset({"copy", "transpose", "slice", "dynamic-slice", "dynamic-update-slice",
                      "concatenate", "pad", "bitcast", "reshape", "broadcast"})
CONTAINERS = frozenset({"while", "call", "conditional"})
KINDS = ("matmul", "data move", "other")


def _parse(line: str) -> tuple[str, str] | None:
  """(name, opcode) of an HLO instruction line, else None."""
  head, eq, rest = line.strip().removeprefix("ROOT ").partition(" = ")
  if not eq or " " in head:
    return None
  rest = rest.lstrip()
  if rest.startswith("("):          # a tuple shape: skip to its closing parenthesis
    depth = 0
    for i, ch in enumerate(rest):
      depth += {"(": 1, ")": -1}.get(ch, 0)
      if depth == 0:
        rest = rest[i + 1:]
        break
  else:
    rest = rest.partition(" ")[2]
  op = rest.lstrip().partition("(")[0]
  return (head.lstrip("%"), op) if op and " " not in op else None


def instruction_kinds(hlo_text: str) -> dict[str, str]:
  """Each instruction name of an HLO module's text -> one of KINDS, or "container"."""
  ops: dict[str, str] = {}              # instruction -> opcode
  calls: dict[str, str] = {}            # fusion instruction -> its computation
  body_ops: dict[str, set[str]] = collections.defaultdict(set)   # computation -> opcodes
  computation = None
  for line in hlo_text.splitlines():
    stripped = line.strip().removeprefix("ENTRY ")
    if stripped.endswith("{") and " = " not in stripped.split("{")[0]:
      computation = stripped.split()[0].lstrip("%")   # a computation's header
      continue
    parsed = _parse(line)
    if parsed is None:
      continue
    name, op = parsed
    ops[name] = op
    if computation is not None:
      body_ops[computation].add(op)
    called = _CALLS.search(line)
    if called and op == "fusion":
      calls[name] = called.group(1)

  def kind(name: str) -> str:
    op = ops[name]
    if op in CONTAINERS:
      return "container"
    inner = body_ops.get(calls.get(name, ""), {op})
    if inner & MATMUL_OPS:
      return "matmul"
    if inner <= MOVE_OPS | {"parameter", "constant", "tuple", "get-tuple-element"}:
      return "data move"
    return "other"
  return {name: kind(name) for name in ops}


def kinds(trace_events: list[tuple[str, float]], hlo_text: str) -> dict[str, float]:
  """Seconds by kind of the (event name, seconds) pairs that name an instruction of
  `hlo_text` (other events: the runtime's own, not the program's, are left out)."""
  of = instruction_kinds(hlo_text)
  out = dict.fromkeys(KINDS, 0.0)
  for name, seconds in trace_events:
    k = of.get(name)
    if k is not None and k != "container":
      out[k] += seconds
  return out


def trace(call: Callable[[], Any], logdir: str):
  """`call()` run under `jax.profiler.trace(logdir)`; the trace's `ProfileData`."""
  with jax.profiler.trace(logdir):
    jax.block_until_ready(call())
  files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
  if not files:
    raise FileNotFoundError(f"no trace under {logdir}")
  return jax.profiler.ProfileData.from_file(files[-1])


def traced_events(call: Callable[[], Any], logdir: str) -> list[tuple[str, float]]:
  """(name, seconds) of every host event while `call()` runs under `jax.profiler`."""
  return [(event.name, event.duration_ns / 1e9) for plane in trace(call, logdir).planes
          if plane.name.startswith("/host:") for line in plane.lines for event in line.events]
