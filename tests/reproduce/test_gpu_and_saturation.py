"""The gpu section's policy, summary and table; the saturation section's stages."""

import json
import os

import numpy as np
import pytest

from isojax import metrics, run_dir
from isojax.models import tokenizer as tokenizer_lib
from isojax.reproduce import gpu, saturation, tables
from isojax.run import memory_estimates

TINY = dict(gpu.QWEN25_1P5B, num_layers=1, embed_dim=32, num_heads=2, num_kv_heads=1,
            head_dim=16, mlp_dim=64, vocab_size=300)


def test_the_policy_samples_from_every_id_and_only_the_tasks_decode_to_digits(tmp_path):
  path = str(tmp_path / "policy")
  gpu.write_policy(path, TINY)
  hf = json.load(open(os.path.join(path, "config.json")))
  assert (hf["vocab_size"], hf["num_hidden_layers"], hf["hidden_size"]) == (300, 1, 32)
  tok = tokenizer_lib.load_tokenizer(path)
  assert tok.eos_id == 2
  assert tok.encode("12+3=") == [4, 5, 13, 6, 14]  # the arithmetic tokenizer's ids
  # 15 = "p", 299 = 11 * 26 + 13 = "ln" in base-26 letters.
  assert [tok.decode([i]) for i in (15, 299)] == ["<p>", "<ln>"]
  padded = tok.decode(list(range(15, 300)))
  assert len(padded) > 285 and not any(c.isdigit() for c in padded)


def _line(step, **values):
  return {run_dir.STEP: step, run_dir.WALL_S: float(step), "rollouts": 16 * step, **values}


def test_summary_averages_the_steps_after_the_first(tmp_path):
  workdir = str(tmp_path)
  times = {1: (9.0, 5.0, 4.0), 2: (2.0, 1.2, 0.8), 3: (3.0, 1.6, 1.4)}
  lines = [_line(0, tokens=0, **{metrics.MEMORY_PLANNED: 30.0})]
  lines += [_line(s, tokens=100 * s, **{metrics.TIME_STEP: t, "time/sample_s": a,
                                         "time/update_s": u,
                                         metrics.MEMORY_DEVICE_PEAK: 20.0 + s})
            for s, (t, a, u) in times.items()]
  with open(os.path.join(workdir, run_dir.METRICS_FILE), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in lines)
  s = gpu.summarize(workdir)
  assert s["steps"] == 2 and s["step_s"] == pytest.approx(np.mean([2.0, 3.0]))
  assert s["update_s"] == pytest.approx(1.1) and s["rollout_wait_s"] is None
  assert (s["planned_gib"], s["device_peak_gib"], s["tokens_per_step"]) == (30.0, 23.0, 100.0)
  row = gpu.table({"synchronous": s})[-1]
  assert row == "| synchronous | 2.50 | 1.40 | 1.10 | n/a | 100 | 30.0 | 23.0 |"


def test_limits_count_model_flops_and_decode_bytes_against_the_datasheet():
  # 2 layers, 1 KV head of 4, vocabulary 10, width 8, MLP 16, tied.
  shape = memory_estimates.Shape(vocab_size=10, num_layers=2, embed_dim=8, num_heads=2,
                                 num_kv_heads=1, head_dim=4, mlp_dim=16, tie_embeddings=True)
  params = shape.params
  # Counted by hand: embedding 80; per layer q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8x16,
  # two norms of 8, q/k/v biases 8 + 4 + 4: 64 + 64 + 64 + 384 + 16 + 16 = 608; final
  # norm 8.
  assert params == 80 + 2 * 608 + 8
  r = dict(step_s=10.0, sample_s=4.0, update_s=5.0, rollout_wait_s=None,
           tokens_per_step=1000.0)
  got = gpu.limits(r, shape, rows=6, new_tokens=100, device_kind="NVIDIA H100 80GB HBM3")
  flops = 6 * params * 1000.0
  assert got["update_tflops"] == pytest.approx(flops / 5.0 / 1e12)
  assert got["mfu"] == pytest.approx(flops / 5.0 / 989.4e12)
  assert got["decode_ms"] == pytest.approx(40.0)
  # Weights in float32, then 6 rows x 50 positions x 2 layers x (k, v) x 4 x 2 bytes.
  read = params * 4 + 6 * 50 * 2 * 2 * 4 * 2
  assert got["decode_gib"] == pytest.approx(read / 2**30)
  assert got["bandwidth_fraction"] == pytest.approx(read / 0.040 / 3.35e12)
  assert got["other_s"] == pytest.approx(1.0)
  pipelined = gpu.limits(dict(r, rollout_wait_s=0.5), shape, rows=6, new_tokens=100,
                         device_kind="cpu")
  assert pipelined["other_s"] == pytest.approx(4.5)
  assert pipelined["mfu"] is None and pipelined["bandwidth_fraction"] is None
  row = gpu.limits_table({"synchronous": got}, "NVIDIA H100 80GB HBM3")[-1]
  assert row.startswith("| synchronous | ") and row.endswith(" | 40.00 | 0.00 | 0.0% | 1.00 |")


def test_the_gpu_section_refuses_a_machine_without_an_accelerator(tmp_path, monkeypatch):
  monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")  # restored afterwards
  inv = tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=".", command="x")
  with pytest.raises(RuntimeError, match="has none"):
    gpu.run(inv)


def test_a_stage_starts_as_a_whole_copy_of_the_one_before(tmp_path):
  source, target = tmp_path / "study_C100", tmp_path / "saturation_C400"
  for name in ("splits", "easy", "hard"):
    (source / name).mkdir(parents=True)
    (source / name / "f.json").write_text(name)
  (source / "other").mkdir()
  saturation._start_stage(str(source), str(target))  # pylint: disable=protected-access
  assert sorted(os.listdir(target)) == ["easy", "hard", "splits"]
  assert (target / "hard" / "f.json").read_text() == "hard"
  (target / "hard" / "f.json").write_text("trained on")
  saturation._start_stage(str(source), str(target))  # pylint: disable=protected-access
  assert (target / "hard" / "f.json").read_text() == "trained on"  # never copied over
  # A source without both sweeps: the stage runs them from the start.
  missing, s2 = str(tmp_path / "missing"), str(tmp_path / "s2")
  saturation._start_stage(missing, s2)  # pylint: disable=protected-access
  assert not (tmp_path / "s2").exists()
  with pytest.raises(ValueError, match="above the study's"):
    saturation.run(tables.Invocation(out=str(tmp_path), results=str(tmp_path), repo=".",
                                     command="x"), 100, [100], ["0"])


def test_each_stage_extends_the_study_sections_seeds_and_nothing_else(tmp_path, monkeypatch):
  """The study section names its runs by seed (bp8_n2_s0, ...); a stage that left out
  --seeds would plan the sweep config's own runs and train them from step 0."""
  calls = []

  def launch_study(inv, target, budget, sweeps, flags):
    del inv, sweeps
    calls.append((os.path.basename(target), budget, list(flags)))
    for sweep in ("easy", "hard"):
      os.makedirs(os.path.join(target, sweep, "runs"), exist_ok=True)
    return "# Findings\n", 1.0

  monkeypatch.setattr(saturation.runs_lib, "launch_study", launch_study)
  monkeypatch.setattr(saturation.runs_lib, "study_images", lambda *a: [])
  monkeypatch.setattr(saturation.tables, "write", lambda inv, name, title, s, body: body)
  body = saturation.run(tables.Invocation(out=str(tmp_path), results=str(tmp_path),
                                          repo=".", command="x"), 100, [400, 200], ["0", "2"])
  assert calls == [("saturation_C200", 200, ["--extend", "--seeds=0,2"]),
                   ("saturation_C400", 400, ["--extend", "--seeds=0,2"])]
  assert "with seeds 0, 2" in body


def test_a_stages_machine_time_is_its_runs_time_since_the_stage_before(tmp_path):
  def run(stage, name, wall_s):
    writer = run_dir.MetricsWriter(tmp_path / stage / name)
    for step, seconds in enumerate(wall_s):
      writer.write(dict(step=step, rollouts=16 * step, tokens=0, wall_s=seconds))
    writer.write(dict(step=len(wall_s) - 1, rollouts=0, tokens=0, wall_s=0.0,
                      event="preempted", message="an event line is not a measurement"))

  run("before", "easy/runs/bp8_n2", [0.0, 10.0])
  run("stage", "easy/runs/bp8_n2", [0.0, 10.0, 25.5])
  run("stage", "hard/runs/bp8_n4", [0.0, 7.0])  # new in this stage
  run("stage", "hard/runs/bp8_n4/checkpoints/3", [0.0, 99.0])  # not a run
  assert saturation.run_seconds(str(tmp_path / "stage"), str(tmp_path / "before")) == (
      pytest.approx((25.5 - 10.0) + 7.0))


def test_a_named_commit_wins_over_the_copys_git(monkeypatch):
  monkeypatch.setenv("ISOJAX_COMMIT", "0123456789abcdef")
  env = tables.environment(os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__)))))
  assert (env["commit"], env["dirty"]) == ("0123456789ab", False)


def test_each_allocation_is_judged_by_its_asymptotes_interval():
  def fit(b_p, n, a, se, flat=False):
    return dict(problems_per_batch=b_p, rollouts_per_problem=n, a=a, a_stderr=se, flat=flat)
  analysis = dict(metric="val/avg@4",
                  fits=[fit(8, 2, 0.50, 0.005), fit(8, 4, 0.70, 0.02), fit(8, 8, 0.60, 0.5),
                        fit(8, 16, 0.9, None), fit(8, 32, 0.4, 0.3, flat=True)])
  evals = {(8, n): [{"val/avg@4": ([0, 90, 100, 400], [0.1, 0.3, 0.35, final])}]
           for n, final in ((2, 0.49), (4, 0.60), (8, 0.55), (16, 0.5), (32, 0.4))}
  rows = {r["rollouts_per_problem"]: r
          for r in saturation.allocation_rows(analysis, 100, evals)}
  # n=2: 0.50 + 1.645 * 0.005 = 0.508 <= 0.49 + 0.02: reached. n=4: 0.70 - 0.033 > 0.60:
  # still rising. n=8: [-0.22, 1.42] holds both. n=16: no error. n=32: flat.
  assert [rows[n]["reached"] for n in (2, 4, 8, 16, 32)] == [True, False, None, None, True]
  assert rows[2]["hi"] == pytest.approx(0.50 + 1.6448536 * 0.005)
  # What the stage added: the final value less the one at C = 100.
  assert [rows[n]["gain"] for n in (2, 4)] == pytest.approx([0.49 - 0.35, 0.60 - 0.35])
  assert saturation.allocation_rows(analysis, 50, evals)[0]["gain"] == pytest.approx(0.49 - 0.1)
  text = "\n".join(saturation.allocation_table("hard", list(rows.values()), 100))
  assert "| reached |" in text and "final best" not in text  # no views: no columns
  assert "2 of 5 allocations have reached" in text and "1 were still rising" in text
  assert "| gain since C = 100 |" in text
  assert "| 8 | 32 | 0.400 | +0.050 | flat (no rise) | yes |" in text
  assert "| 8 | 16 | 0.500 | +0.150 | 0.900 [undetermined] | undetermined |" in text


def test_each_allocation_ends_at_its_runs_last_evaluation_not_its_last_record(tmp_path):
  """The analysis keeps a run's record-breaking points only; the table reads the run."""
  def run(name, lines):
    run_dir.write_config(tmp_path / name, dict(problems_per_batch=8, rollouts_per_problem=2))
    writer = run_dir.MetricsWriter(tmp_path / name)
    for line in lines:
      writer.write(dict(dict(tokens=0, wall_s=0.0), **line))
    return str(tmp_path / name)

  def evaluation(step, avg, best, worst):
    return {"step": step, "rollouts": 16 * step, "val/avg@4": avg, "val/best@4": best,
            "val/worst@4": worst}

  path = run("bp8_n2", [evaluation(0, 0.1, 0.2, 0.0), dict(step=1, rollouts=16, loss=1.0),
                        evaluation(5, 0.45, 0.5, 0.25), evaluation(9, 0.4, 0.625, 0.125),
                        dict(step=9, rollouts=144, event="preempted", message="resumed")])
  analysis = dict(
      metric="val/avg@4",
      fits=[dict(problems_per_batch=8, rollouts_per_problem=2, a=0.5, a_stderr=0.01)],
      # The record-breaking points: 0.4 at the end is below the 0.45 before it.
      records=[dict(path=path, problems_per_batch=8, rollouts_per_problem=2,
                    rollouts=[0, 80], values=[0.1, 0.45])],
      views={"val/best@4": {}, "val/worst@4": {}})
  evals = saturation.evaluations(analysis)
  assert evals[8, 2][0]["val/avg@4"] == ([0.0, 80.0, 144.0], [0.1, 0.45, 0.4])
  [row] = saturation.allocation_rows(analysis, 100, evals)
  assert (row["final"], row["gain"]) == (0.4, pytest.approx(0.4 - 0.45))
  assert row["views"] == {"val/best@4": 0.625, "val/worst@4": 0.125}
  text = saturation.allocation_table("easy", [row], 100)
  assert text[2].endswith("| reached | final best@4 | final worst@4 |")
  assert text[3] == "|---|---|---|---|---|---|---|---|"
  assert text[4] == "| 8 | 2 | 0.400 | -0.050 | 0.500 [0.484, 0.516] | no | 0.625 | 0.125 |"


def test_an_allocation_with_several_seeds_is_their_mean():
  """Three seeds of one allocation: final, gain and views are their means (by hand);
  the table says how many seeds each value is over."""
  analysis = dict(metric="val/avg@4", views={"val/best@4": {}},
                  fits=[dict(problems_per_batch=16, rollouts_per_problem=32, a=0.5,
                             a_stderr=0.01)])
  ends = ((0.20, 0.425, 0.6), (0.22, 0.232, 0.35), (0.21, 0.328, 0.5))
  evals = {(16, 32): [{"val/avg@4": ([0, 100, 400], [0.1, before, end]),
                       "val/best@4": ([0, 100, 400], [0.2, 0.3, best])}
                      for before, end, best in ends]}
  [row] = saturation.allocation_rows(analysis, 100, evals)
  assert row["seeds"] == 3
  assert row["final"] == pytest.approx((0.425 + 0.232 + 0.328) / 3)
  assert row["gain"] == pytest.approx(((0.425 - 0.20) + (0.232 - 0.22) + (0.328 - 0.21)) / 3)
  assert row["views"]["val/best@4"] == pytest.approx((0.6 + 0.35 + 0.5) / 3)
  text = saturation.allocation_table("hard", [row], 100)
  assert "| final avg@4 (mean of 3 seeds) |" in text[2]
