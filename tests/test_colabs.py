"""The colabs execute, on small settings, and show what the library computes.

Each notebook starts with its install cell (tagged `install`, skipped here: isojax is
installed) and has a settings cell (tagged `parameters`) after which the test inserts
smaller settings, papermill-style. A cell appended at the end prints the notebook's
results as JSON; the test recomputes them by calling the library directly.
"""

import json
import os
import sys

import nbclient
import nbformat
import numpy as np
import pytest

from isojax.configs import hard
from isojax import metrics, run_dir
from isojax.planner import analysis, prescribe, synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _execute(name: str, settings: dict, results: str,
             monkeypatch) -> tuple[dict, nbformat.NotebookNode]:
  """Runs colabs/<name> with `settings` injected; returns what `results` (an expression)
  evaluates to in the notebook's kernel, and the executed notebook."""
  # The kernel's `python` is this interpreter (a venv's, in CI), not another on PATH.
  monkeypatch.setenv("PATH", os.pathsep.join([os.path.dirname(sys.executable),
                                               os.environ.get("PATH", "")]))
  nb = nbformat.read(os.path.join(ROOT, "colabs", name), as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  tags = [c.metadata.get("tags", []) for c in code]
  # A Colab user needs only the first cell to install; nothing else installs.
  assert "install" in tags[0] and "pip install" in code[0].source, name
  assert sum("pip install" in c.source for c in code) == 1, name
  code[0].source = "pass  # install cell skipped: isojax is installed"
  (parameters,) = [i for i, c in enumerate(nb.cells) if "parameters" in
                   c.metadata.get("tags", [])]
  nb.cells.insert(parameters + 1, nbformat.v4.new_code_cell(
      "\n".join(f"{k} = {v!r}" for k, v in settings.items())))
  nb.cells.append(nbformat.v4.new_code_cell(f"import json; print(json.dumps({results}))"))
  for i, cell in enumerate(nb.cells):
    cell["id"] = f"cell-{i}"
  nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": ROOT}}).execute()
  (out,) = [o for o in nb.cells[-1].outputs if o.output_type == "stream"]
  return json.loads(out.text), nb


def _images(nb) -> int:
  return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code"
             for o in c.outputs)


def _plan(budget, law):
  return prescribe.prescribe(budget, law, hard.get_config(), max_batch_rollouts=1024,
                             problems_range=(8, 1024), rollouts_range=(2, 2048),
                             min_steps=10).to_dict()


@pytest.mark.slow("executes the quick-start notebook, a training run included")
def test_quickstart_runs_and_reports_the_run_it_wrote(tmp_path, monkeypatch):
  workdir = str(tmp_path / "run")
  budget = 2**16
  got, nb = _execute("quickstart.ipynb", dict(
      PRESET="micro", NUM_STEPS=2, WORKDIR=workdir,
      BUDGET_ROLLOUTS=budget), "{'final': final, 'plan': plan.to_dict()}", monkeypatch)
  lines = run_dir.read_metrics(workdir)
  assert [line["step"] for line in lines] == [0, 1, 2]  # the injected settings held
  # The last evaluation the notebook shows is the last line's (validation and the
  # pass@1 histogram).
  assert any(k.startswith(metrics.VAL_PREFIX) for k in got["final"])
  assert got["final"] == {k: lines[-1][k] for k in got["final"]}
  assert metrics.TRAIN_PASS1_HISTOGRAM in got["final"]
  assert any(name.startswith("events.out.tfevents") for name in os.listdir(workdir))
  assert _images(nb) == 1  # the metrics-vs-compute plot
  expected = _plan(budget, prescribe.default_law("hard", max_batch_rollouts=1024))
  assert json.loads(json.dumps(expected)) == got["plan"]


def test_planner_fits_the_sweep_and_prescribes_as_the_library_does(tmp_path, monkeypatch):
  rollouts, evals, budget = (2, 4, 8, 16, 32), 20, 2**19
  got, nb = _execute("planner.ipynb", dict(
      DEMO_DIR=str(tmp_path / "demo"), DEMO_ROLLOUTS=rollouts, DEMO_EVALS=evals,
      PLAN_BUDGET=budget), "{'law': law.to_dict(), 'plan': plan.to_dict(), "
                           "'fits': len(fits.curve_fits)}", monkeypatch)
  # The same sweep written and analysed here, outside the notebook.
  synthetic.write_demo_sweep(str(tmp_path / "mine"), rollouts=rollouts, num_evals=evals)
  result = analysis.analyze_directory(str(tmp_path / "mine"))
  assert got["fits"] == len(synthetic.DEMO_PROBLEMS) * len(rollouts)
  expected_law = result.primary.law.to_dict()
  assert got["law"].keys() == expected_law.keys()
  for key, value in expected_law.items():
    if isinstance(value, float):
      np.testing.assert_allclose(got["law"][key], value, rtol=1e-9, err_msg=key)
    else:
      assert got["law"][key] == json.loads(json.dumps(value)), key
  assert got["plan"] == json.loads(json.dumps(_plan(budget, result.primary.law)))
  assert _images(nb) == 3  # metric vs compute, n*(C), the avg/best/worst views
