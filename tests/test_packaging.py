"""What `pip install isojax` ships: every source folder, the configs and the demo bases."""

import os

import pytest
import setuptools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_source_folder_is_a_package():
  """A folder of modules without __init__.py would be left out of the wheel."""
  found = set(setuptools.find_packages(ROOT, include=["isojax", "isojax.*", "launch"]))
  folders = set()
  for top in ("isojax", "launch"):
    for path, _, files in os.walk(os.path.join(ROOT, top)):
      if any(f.endswith(".py") for f in files) and "__pycache__" not in path:
        folders.add(os.path.relpath(path, ROOT).replace(os.sep, "."))
  assert folders == found
  assert {"isojax.configs", "isojax.sweeps", "isojax.bench"} <= found


def test_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch):
  from isojax import configs  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  assert configs.find_spec("configs/hard.py:micro") == (
      os.path.join(ROOT, "isojax", "configs", "hard.py") + ":micro")
  local = tmp_path / "configs" / "hard.py"   # a file of that path here wins
  local.parent.mkdir()
  local.write_text("")
  assert configs.find("configs/hard.py") == "configs/hard.py"
  with pytest.raises(FileNotFoundError, match="'configs/nope.py' does not exist") as e:
    configs.find("configs/nope.py")
  assert os.path.join("isojax", "configs", "nope.py") in str(e.value)  # both places named
