"""The shape legend (`isojax.shapes`): every array name in isojax/ keeps to it."""

import ast
import os
import re

import pytest

from isojax import shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A shape suffix: after the last underscore, a capital then capitals and digits, behind a
# stem with a lowercase letter (so `MAX_DECODE_BLOCKS` and `_B_GRID` are constants).
SUFFIX = re.compile(r"^(?P<stem>\w*[a-z]\w*?)_(?P<suffix>[A-Z][A-Z0-9]*)$")


def _identifiers(tree: ast.AST):
  """(name, line) of every name a module binds or reads: variables, arguments,
  attributes, keywords, functions and classes."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Name):
      yield node.id, node.lineno
    elif isinstance(node, ast.arg):
      yield node.arg, node.lineno
    elif isinstance(node, ast.Attribute):
      yield node.attr, node.lineno
    elif isinstance(node, ast.keyword) and node.arg:
      yield node.arg, node.value.lineno
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      yield node.name, node.lineno


def suffix_errors(name: str) -> list[str]:
  """What is wrong with `name`'s shape suffix ([] when it has none or keeps the legend)."""
  match = SUFFIX.match(name)
  if not match:
    return []
  letters = [c for c in match["suffix"] if c.isalpha()]
  errors = [f"{c!r} is not in the legend" for c in sorted(set(letters) - set(shapes.LEGEND))]
  for whole, parts in shapes.COMPOSITE.items():
    if whole in letters and set(parts) & set(letters):
      errors.append(f"{whole!r} is made of {parts!r}: a name holds one or the other")
  return errors


def _package_sources():
  for dirpath, _, files in os.walk(os.path.join(ROOT, "isojax")):
    for f in sorted(files):
      if f.endswith(".py"):
        yield os.path.join(dirpath, f)


def test_every_array_name_in_the_package_keeps_to_the_legend():
  bad = set()
  for path in _package_sources():
    with open(path) as f:
      tree = ast.parse(f.read(), path)
    for name, line in _identifiers(tree):
      for error in suffix_errors(name):
        bad.add(f"{os.path.relpath(path, ROOT)}:{line}: {name}: {error}")
  assert not bad, "names outside the shape legend (isojax/shapes.py):\n" + "\n".join(sorted(bad))


@pytest.mark.parametrize("name, wrong", [
    ("x_BSNH", "'B' is made of"),       # N as heads, beside B
    ("mass_BNC", "'B' is made of"),     # N as blocks
    ("x_BSQKH", "'Q' is made of"),
    ("mask_BST", "'S' is made of"),     # T as key positions
    ("rollout_DO", "'O' is not in the legend"),
])
def test_the_check_finds_names_that_break_the_legend(name, wrong):
  assert any(wrong in e for e in suffix_errors(name)), suffix_errors(name)


@pytest.mark.parametrize("name", ["logits_BTV", "u_B1", "versions_B2", "rewards_GN",
                                  "k_LGPKH", "mask_BSS", "x_BSQH", "MAX_DECODE_BLOCKS",
                                  "_B_GRID", "num_slots", "lora_rank"])
def test_the_check_passes_names_that_keep_it(name):
  assert suffix_errors(name) == []


def test_the_docs_table_is_the_legend():
  with open(os.path.join(ROOT, "docs", "shapes.md")) as f:
    rows = re.findall(r"^\| `([A-Z])` \| (.+) \|$", f.read(), re.M)
  assert dict(rows) == shapes.LEGEND
  assert len(rows) == len(shapes.LEGEND)  # no letter twice
