"""The documentation: links resolve, paths named in code exist, the README stays short."""

import os
import re
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"\]\(([^)\s]+)\)")
DOCS_PATH = re.compile(r"\bdocs/[\w./-]*\w")


def _tracked(*patterns):
  try:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
  except (OSError, subprocess.CalledProcessError):
    pytest.skip("not a git checkout")
  return [f for f in out if os.path.isfile(os.path.join(ROOT, f))]


def _markdown_files():
  return _tracked("*.md")


def test_every_relative_link_in_the_docs_resolves():
  broken = []
  for md in _markdown_files():
    with open(os.path.join(ROOT, md)) as f:
      text = f.read()
    for target in LINK.findall(text):
      if re.match(r"[a-z]+:", target) or target.startswith("#"):
        continue  # a URL or an anchor in the same file
      path = os.path.normpath(os.path.join(ROOT, os.path.dirname(md), target.split("#")[0]))
      if not os.path.exists(path):
        broken.append(f"{md}: ({target})")
  assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_docs_path_named_in_code_or_docs_exists():
  missing = []
  for name in _tracked("*.py", "*.md", "*.ipynb"):
    if name.startswith("tests/"):
      continue  # tests name paths under temporary directories
    with open(os.path.join(ROOT, name)) as f:
      text = f.read()
    for path in set(DOCS_PATH.findall(text)):
      if not os.path.exists(os.path.join(ROOT, path)):
        missing.append(f"{name}: {path}")
  assert not missing, "paths to nothing:\n" + "\n".join(sorted(missing))


def test_readme_is_a_front_page():
  with open(os.path.join(ROOT, "README.md")) as f:
    lines = f.read().splitlines()
  assert len(lines) <= 320, f"README.md has {len(lines)} lines; reference goes in docs/"
  assert not [l for l in lines if re.search(r"\bsessions?\b", l, re.I)]
