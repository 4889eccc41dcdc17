"""Prose that names code names something that exists.

Docstrings, comments and the Markdown docs name modules (`isojax.rl.update`,
`isojax/rl/update.py`), their functions and classes (`rollout.sample` as
`isojax.rl.rollout.sample`), config fields (`rl.max_staleness`,
`--config.sampling.decode_slots=8`) and doc sections (`configs.md#memory-...`). Each
kind is checked against the code as it is: the package's files and the top-level names
each module defines (read with `ast`, nothing imported), `config_lib.base_config()`'s
fields, and the headings of each Markdown file.
"""

import ast
import functools
import os
import re

import pytest

from isojax.config import config_lib
from test_docs import _tracked  # the repository's files, as git lists them

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("isojax", "launch")
# A path into the repository's own folders, as prose writes it.
REPO_PATH = re.compile(r"(?<![\w/.-])((?:isojax|launch|configs|tests|colabs)/[\w/.-]*\.(?:py|md|ipynb))")
DOTTED = re.compile(r"(?<![\w./-])((?:isojax|launch)(?:\.[A-Za-z_]\w*)+)")
# A config field in backticks (`rl.max_staleness`, `sampling.decode_slots=8`) or a flag.
FLAG_FIELD = re.compile(r"--config\.([\w.]+)=")
TICKED = re.compile(r"`([a-z_]+(?:\.[a-z_0-9]+)+)(?:=[^`]*)?`")
LINK = re.compile(r"\]\(([^)\s]*#[^)\s]+)\)")
# A section named in words: the README's `Quick start` section, docs/x.md, "Limits".
NAMED_SECTION = re.compile(r"(README|docs/[\w/]+\.md)(?:'s)? [`\"]([^`\"]+)[`\"](?: section)?")


def _python_prose(path):
  """The docstrings and comments of a Python file, as (line, text)."""
  with open(os.path.join(ROOT, path)) as f:
    source = f.read()
  tree = ast.parse(source)
  out = []
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      doc = ast.get_docstring(node, clean=False)
      if doc:
        out.append((node.body[0].lineno, doc))
  for number, line in enumerate(source.splitlines(), 1):
    if "#" in line:
      comment = line[line.index("#"):]
      out.append((number, comment))
  return out


# History: the changelog names what the code had then.
HISTORY = ("CHANGELOG.md",)
# Placeholders and the deliberately misspelt example of the unknown-field error.
PLACEHOLDERS = {"launch.x", "--config.field=", "--config.a.b=", "--config.sampling.temprature="}
SUBPACKAGES = ("isojax", "isojax.rl", "isojax.sampling", "isojax.models", "isojax.planner",
               "isojax.sweeps", "isojax.tasks", "isojax.bench", "isojax.reproduce", "launch")
FILE_NAMES = re.compile(r"\.(safetensors|json|jsonl|md|py|txt|gguf)(\.|$)")


def _prose():
  """(where, text) of every doc and every Python docstring and comment."""
  for md in _tracked("*.md"):
    if md in HISTORY:
      continue
    with open(os.path.join(ROOT, md)) as f:
      for number, line in enumerate(f, 1):
        yield f"{md}:{number}", line
  for py in _tracked("*.py"):
    if py.startswith(("isojax/", "launch/", "configs/", "tests/", "colabs/")) or "/" not in py:
      for number, text in _python_prose(py):
        yield f"{py}:{number}", text


@functools.lru_cache(maxsize=None)
def _module_names(module):
  """({name: None, or the module an import binds it to}) of `module` (dotted) with
  each class's attributes as 'Class.attr'; None when no such module file exists."""
  base = os.path.join(ROOT, *module.split("."))
  for path in (base + ".py", os.path.join(base, "__init__.py")):
    if os.path.isfile(path):
      break
  else:
    return None
  with open(path) as f:
    tree = ast.parse(f.read())
  names = {}
  for node in tree.body:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
      names[node.name] = None
      if isinstance(node, ast.ClassDef):
        for item in ast.walk(node):
          if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[f"{node.name}.{item.name}"] = None
          elif isinstance(item, (ast.AnnAssign, ast.Assign)):
            for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
              for name in ast.walk(target):
                if isinstance(name, ast.Name):
                  names[f"{node.name}.{name.id}"] = None
                elif isinstance(name, ast.Attribute):  # self.x = ... in a method
                  names[f"{node.name}.{name.attr}"] = None
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
      for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
        names.update((n.id, None) for n in ast.walk(target) if isinstance(n, ast.Name))
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      for alias in node.names:
        names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    elif isinstance(node, ast.Import):
      for alias in node.names:
        names[alias.asname or alias.name.split(".")[0]] = (
            alias.name if alias.asname else alias.name.split(".")[0])
  return names


def _resolves(dotted):
  """Whether a dotted `isojax` or `launch` name is a module of the repository, or a name one
  defines (a class attribute, or a name reached through one of its imports)."""
  parts = dotted.split(".")
  for cut in range(len(parts), 0, -1):
    names = _module_names(".".join(parts[:cut]))
    if names is None:
      continue
    rest = parts[cut:]
    if not rest or (len(rest) == 1 and rest[0] in names):
      return True
    if rest[0] not in names:
      return False
    if f"{rest[0]}.{rest[1]}" in names:
      return True
    target = names[rest[0]]  # an import: follow it inside the repository's packages
    if target is None or not target.startswith(PACKAGES):
      return target is not None  # a class's deeper attribute, or another library's
    return _resolves(".".join([target, *rest[1:]]))
  return False


def _names_code(token):
  """`rl.update.score`, `guard.collapse`: a module or name under one of the packages."""
  return any(_resolves(f"{package}.{token}") for package in SUBPACKAGES)


def _sweep_fields():
  """The fields of a sweep config (`configs/sweep_*.py`), which `launch.sweep` reads."""
  from configs import sweep_hard  # pylint: disable=g-import-not-at-top
  fields = set()

  def walk(prefix, node):
    for key, value in node.items():
      fields.add(f"{prefix}{key}")
      if hasattr(value, "items"):
        walk(f"{prefix}{key}.", value)
  walk("", sweep_hard.get_config())
  return fields


def _config_fields():
  fields = set()

  def walk(prefix, node):
    for key, value in node.items():
      name = f"{prefix}{key}"
      fields.add(name)
      if hasattr(value, "items"):
        walk(f"{name}.", value)
  walk("", config_lib.base_config())
  return fields


def _slug(heading):
  """GitHub's anchor for a Markdown heading."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def _anchors(md):
  with open(md) as f:
    return {_slug(line.lstrip("#")) for line in f if re.match(r"#{1,6} ", line)}


def test_paths_named_in_prose_exist():
  missing = []
  for where, text in _prose():
    for path in REPO_PATH.findall(text):
      if not os.path.exists(os.path.join(ROOT, path)):
        missing.append(f"{where}: {path}")
  assert not missing, "paths to nothing:\n" + "\n".join(missing)


def test_modules_and_names_named_in_prose_exist():
  missing = []
  for where, text in _prose():
    for dotted in DOTTED.findall(text):
      if dotted not in PLACEHOLDERS and not _resolves(dotted.rstrip(".")):
        missing.append(f"{where}: {dotted}")
  assert not missing, "names of nothing:\n" + "\n".join(sorted(set(missing)))


def test_config_fields_named_in_prose_exist():
  fields, sweep_fields = _config_fields(), _sweep_fields()
  sections = {f for f in fields if "." not in f and hasattr(config_lib.base_config()[f], "items")}
  free = tuple(f"{f}." for f in config_lib.FREE_FORM_FIELDS)
  known = lambda field: (field in fields or field.startswith(free)
                         or field.removeprefix("overrides.") in fields
                         or field in sweep_fields)
  missing = []
  for where, text in _prose():
    for field in FLAG_FIELD.findall(text):
      if f"--config.{field}=" not in PLACEHOLDERS and not known(field):
        missing.append(f"{where}: --config.{field}=")
    for field in TICKED.findall(text):
      if (field.split(".")[0] in sections and not known(field)
          and not FILE_NAMES.search(field) and not _names_code(field)):
        missing.append(f"{where}: `{field}`")
  assert not missing, "fields that do not exist:\n" + "\n".join(missing)


def test_section_links_name_a_heading():
  missing = []
  for md in _tracked("*.md"):
    with open(os.path.join(ROOT, md)) as f:
      text = f.read()
    for target in LINK.findall(text):
      if re.match(r"[a-z]+:", target):
        continue
      file, anchor = target.split("#", 1)
      path = (os.path.join(ROOT, md) if not file
              else os.path.normpath(os.path.join(ROOT, os.path.dirname(md), file)))
      if path.endswith(".md") and os.path.isfile(path) and anchor not in _anchors(path):
        missing.append(f"{md}: ({target})")
  assert not missing, "links to no heading:\n" + "\n".join(missing)


def test_sections_named_in_words_exist():
  missing = []
  for where, text in _prose():
    for file, section in NAMED_SECTION.findall(text):
      path = os.path.join(ROOT, "README.md" if file == "README" else file)
      with open(path) as f:
        headings = [line.lstrip("#").strip().lower() for line in f if line.startswith("#")]
      if not any(section.lower() in h for h in headings):
        missing.append(f"{where}: {file} {section!r}")
  assert not missing, "sections that do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("text,ok", [
    ("see `isojax.rl.optimizer.make_optimizer`", True),
    ("see `isojax.rl.update.no_such_function`", False),
    ("see isojax/rl/update.py", True),
    ("see isojax/rl/no_such_module.py", False),
])
def test_the_checks_catch_what_they_should(text, ok):
  found = ([_resolves(d) for d in DOTTED.findall(text)]
           + [os.path.exists(os.path.join(ROOT, p)) for p in REPO_PATH.findall(text)])
  assert found and all(found) == ok
