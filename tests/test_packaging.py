"""What `pip install isojax` ships: every source folder, the configs and the demo bases.

The config files live in `configs/` at the top of the repository; `isojax/configs` is a
link to that folder (configs/__init__.py says why), so a checkout runs the very files a
user edits and a wheel holds them as `isojax/configs/`.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import setuptools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOP_CONFIGS = os.path.join(ROOT, "configs")


def test_every_source_folder_is_a_package():
  """A folder of modules without __init__.py would be left out of the wheel."""
  found = set(setuptools.find_packages(ROOT, include=["isojax", "isojax.*", "launch"]))
  folders = set()
  for top in ("isojax", "launch"):
    # find_packages follows links; so does this walk (isojax/configs is one).
    for path, _, files in os.walk(os.path.join(ROOT, top), followlinks=True):
      if any(f.endswith(".py") for f in files) and "__pycache__" not in path:
        folders.add(os.path.relpath(path, ROOT).replace(os.sep, "."))
  assert folders == found
  assert {"isojax.configs", "isojax.sweeps", "isojax.bench"} <= found


def test_the_config_files_live_at_the_top_and_are_the_files_that_run(tmp_path, monkeypatch):
  top = os.path.join(TOP_CONFIGS, "hard.py")
  assert os.path.isfile(top) and not os.path.islink(top)
  link = os.path.join(ROOT, "isojax", "configs")
  assert os.path.islink(link) and os.path.samefile(link, TOP_CONFIGS)  # not a copy
  from isojax import configs  # pylint: disable=g-import-not-at-top
  from isojax.configs import hard  # pylint: disable=g-import-not-at-top
  assert os.path.samefile(hard.__file__, top)
  monkeypatch.chdir(ROOT)
  assert os.path.samefile(configs.find("configs/hard.py"), top)
  monkeypatch.chdir(tmp_path)
  assert configs.find("configs/hard.py") == os.path.realpath(top)  # named by its real path


def test_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch):
  from isojax import configs  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  real = os.path.realpath(TOP_CONFIGS)
  assert configs.find_spec("configs/hard.py:micro") == os.path.join(real, "hard.py:micro")
  local = tmp_path / "configs" / "hard.py"   # a file of that path here wins
  local.parent.mkdir()
  local.write_text("")
  assert configs.find("configs/hard.py") == "configs/hard.py"
  with pytest.raises(FileNotFoundError, match="'configs/nope.py' does not exist") as e:
    configs.find("configs/nope.py")
  assert os.path.join(real, "nope.py") in str(e.value)  # both places named


def test_a_config_spec_loads_its_presets_get_config_unlocked(tmp_path, monkeypatch):
  from isojax import configs  # pylint: disable=g-import-not-at-top
  from isojax.configs import smollm2  # pylint: disable=g-import-not-at-top
  monkeypatch.chdir(tmp_path)
  loaded = configs.load("configs/smollm2.py:bench")
  assert loaded.to_dict() == smollm2.get_config("bench").to_dict()
  assert loaded.to_dict() != smollm2.get_config().to_dict()  # the preset, not the default
  loaded.new_field = 1  # unlocked, as a --config flag leaves it
  local = tmp_path / "mine.py"
  local.write_text("import ml_collections\n\ndef get_config(arg=None):\n"
                   "  return ml_collections.ConfigDict(dict(arg=arg))\n")
  assert configs.load(f"{local}:x").arg == "x" and configs.load(str(local)).arg is None
  with pytest.raises(FileNotFoundError, match="'configs/nope.py' does not exist"):
    configs.load("configs/nope.py:micro")


def _copy_tracked(dest, *paths):
  """The tracked files under `paths` as a clean checkout has them (links kept)."""
  try:
    names = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.splitlines()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  for name in names:
    src, dst = os.path.join(ROOT, name), os.path.join(dest, name)
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.islink(src):
      os.symlink(os.readlink(src), dst)
    elif os.path.isfile(src):
      shutil.copy2(src, dst)


def test_the_wheel_holds_the_configs_once_as_isojax_configs(tmp_path):
  if (importlib.util.find_spec("setuptools.command.bdist_wheel") is None
      and importlib.util.find_spec("wheel") is None):
    pytest.skip("no bdist_wheel: setuptools < 70.1 without the wheel package")
  src, out = tmp_path / "src", tmp_path / "dist"
  _copy_tracked(src, "setup.py", "isojax", "launch", "configs")
  subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                  "build_meta.build_wheel(sys.argv[1])", str(out)],
                 cwd=src, check=True, capture_output=True)
  (wheel,) = out.glob("*.whl")
  shipped = sorted(n for n in os.listdir(TOP_CONFIGS) if n.endswith(".py"))
  assert "hard.py" in shipped and "__init__.py" in shipped
  with zipfile.ZipFile(wheel) as z:
    names = z.namelist()
    for name in shipped:
      with open(os.path.join(TOP_CONFIGS, name), "rb") as f:
        assert z.read(f"isojax/configs/{name}") == f.read(), name
    assert not [n for n in names if n.startswith("configs/")]  # one copy, in the package
    z.extractall(tmp_path / "site")

  # Installed from the wheel, `--config=configs/hard.py` names its file from anywhere.
  elsewhere = tmp_path / "elsewhere"
  elsewhere.mkdir()
  found = subprocess.run(
      [sys.executable, "-c", "from isojax import configs; from isojax.configs import hard; "
       "print(configs.find('configs/hard.py')); print(hard.__file__)"],
      cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(tmp_path / "site")},
      capture_output=True, text=True, check=True).stdout.split()
  expected = os.path.join(os.path.realpath(tmp_path / "site"), "isojax", "configs", "hard.py")
  assert [os.path.realpath(p) for p in found] == [expected, expected]
