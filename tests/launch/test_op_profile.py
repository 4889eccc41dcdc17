"""launch.bench --update_profile: HLO instructions by kind, traced seconds summed by kind."""

import json
import os
import subprocess
import sys

import pytest

from isojax.bench import op_profile, report

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

HLO = """HloModule jit_f, is_scheduled=true

%fused_computation (param_0: f32[8,4], param_1: f32[4,6]) -> f32[8,6] {
  %param_0 = f32[8,4]{1,0} parameter(0)
  %param_1 = f32[4,6]{1,0} parameter(1)
  ROOT %dot.3 = f32[8,6]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_move (param_0.1: f32[6,8]) -> f32[8,6] {
  %param_0.1 = f32[6,8]{1,0} parameter(0)
  ROOT %transpose.2 = f32[8,6]{1,0} transpose(%param_0.1), dimensions={1,0}
}

%body (p: (s32[], f32[8,6])) -> (s32[], f32[8,6]) {
  %p = (s32[], f32[8,6]{1,0}) parameter(0)
  %gte = f32[8,6]{1,0} get-tuple-element(%p), index=1
  %add.7 = f32[8,6]{1,0} add(%gte, %gte)
  %i = s32[] get-tuple-element(%p), index=0
  ROOT %tuple.1 = (s32[], f32[8,6]{1,0}) tuple(%i, %add.7)
}

ENTRY %main.10 (x: f32[8,4], w: f32[4,6], t: f32[6,8]) -> f32[8,6] {
  %x = f32[8,4]{1,0} parameter(0)
  %w = f32[4,6]{1,0} parameter(1)
  %t = f32[6,8]{1,0} parameter(2)
  %ynn_fusion.41 = f32[8,6]{1,0} fusion(%x, %w), kind=kCustom, calls=%fused_computation
  %copy_fusion.5 = f32[8,6]{1,0} fusion(%t), kind=kLoop, calls=%fused_move
  %init = (s32[], f32[8,6]{1,0}) tuple(%c, %ynn_fusion.41)
  %while.9 = (s32[], f32[8,6]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %exponential.1 = f32[8,6]{1,0} exponential(%copy_fusion.5)
}
"""


def test_instructions_are_classified_by_what_they_compute():
  kinds = op_profile.instruction_kinds(HLO)
  assert kinds["ynn_fusion.41"] == "matmul"        # a fusion whose computation has a dot
  assert kinds["dot.3"] == "matmul"
  assert kinds["copy_fusion.5"] == "data move"     # a fusion of a transpose only
  assert kinds["transpose.2"] == "data move"
  assert kinds["add.7"] == "other" and kinds["exponential.1"] == "other"
  assert kinds["while.9"] == "container"           # a tuple-shaped instruction, parsed
  assert kinds["tuple.1"] == "data move"            # bookkeeping, never a traced thunk
  assert "main.10" not in kinds and "fused_computation" not in kinds


def test_seconds_are_summed_by_kind_without_containers_or_runtime_events():
  events = [("ynn_fusion.41", 2.0), ("ynn_fusion.41", 1.5), ("copy_fusion.5", 0.25),
            ("exponential.1", 0.125), ("while.9", 9.0),            # holds the others
            ("ThunkExecutor::Execute", 7.0), ("$api.py:2479 block_until_ready", 8.0)]
  assert op_profile.kinds(events, HLO) == {"matmul": 3.5, "data move": 0.25, "other": 0.125}


_TRACE = """
import json, sys
import jax, jax.numpy as jnp
from isojax.bench import op_profile
def f(x, w):
  return jnp.sum(jnp.tanh(x @ w) ** 2)
x, w = jnp.ones((256, 128)), jnp.full((128, 256), 0.01)
g = jax.jit(jax.grad(f, argnums=1))
hlo = g.lower(x, w).compile().as_text()
events = op_profile.traced_events(lambda: g(x, w), sys.argv[1])
print(json.dumps(dict(names=op_profile.instruction_kinds(hlo), events=events,
                      seconds=op_profile.kinds(events, hlo))))
"""


def test_a_traced_program_s_events_carry_its_instruction_names(tmp_path):
  """On this XLA:CPU the thunks' trace events are named after the compiled HLO's
  instructions: the dots of a jitted gradient are found and timed, and every traced
  instruction of the program gets a kind. (In a child with JAX_PLATFORMS=cpu: libtpu's
  profiler plugin, when installed, crashes a CPU trace.)"""
  proc = subprocess.run([sys.executable, "-c", _TRACE, str(tmp_path)], cwd=REPO,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = json.loads(proc.stdout.strip().splitlines()[-1])
  names, events = got["names"], got["events"]
  traced = {name for name, _ in events if name in names}
  assert any(names[n] == "matmul" for n in traced)
  assert got["seconds"]["matmul"] > 0
  assert sum(got["seconds"].values()) == pytest.approx(
      sum(s for n, s in events if names.get(n) not in (None, "container")))


def test_the_update_line_gives_the_traced_shares_and_the_matmul_kernels_rate():
  u = dict(batch=8, seq_len=195, prompt_len=67, tokens_per_s=10.0, flops_per_s=6e10,
           matmul_peak_flops_per_s=1.2e11, fraction_of_peak=0.5, mfu=None,
           profile=dict(seconds={"matmul": 6.0, "data move": 1.5, "other": 0.5},
                        matmul_flops_per_s=9e10))
  lines = report._update_lines(dict(update=u), dict(matmul_size=2048))
  assert lines[2] == ("  traced step: matmul 6.00 s (75%), data move 1.50 s (19%), other "
                      "0.50 s (6%); the model FLOPs over the matmul seconds: 90.0 GFLOP/s, "
                      "75% of the matmul peak")
  assert len(report._update_lines(dict(update=dict(u, profile=None)),
                                  dict(matmul_size=2048))) == 2
