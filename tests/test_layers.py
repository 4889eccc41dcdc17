"""The package's layers only reach down: no import cycle, a pure planner, thin binaries.

The import graph is read from the source with `ast`, so the checks see every import,
those at module level and those inside functions: an import moved into a function
still ties the two modules together, and would form the same cycle if it were hoisted.
A function-level import is allowed for a third-party module only (an optional or heavy
dependency loaded when used); one of an isojax module is listed in
`FUNCTION_LEVEL_IMPORTS` with its reason. (Modules loaded by name, as `isojax.tasks`
loads its families, are outside the graph.)
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("isojax", "launch")

# (importing module, imported module) -> why the import waits for the call.
_TRL_SIDES = ("each side of the TRL comparison is a child process that imports its own "
              "stack, in the order it needs (torch and transformers before JAX); a process "
              "that imports the module for its tables (launch.bench, the reproduce "
              "command) loads neither")
_CANDIDATES = ("the reproduce command's own process loads JAX and the RL stack only when "
               "the smollm2 section evaluates the base model in it; every other run is a "
               "child process")
FUNCTION_LEVEL_IMPORTS: dict[tuple[str, str], str] = {
    **{("isojax.bench.trl_step", target): _TRL_SIDES for target in (
        "isojax.bench.train_step", "isojax.config.config_lib", "isojax.configs",
        "isojax.metrics", "isojax.models.gguf_checkpoint", "isojax.models.hf_checkpoint",
        "isojax.models.tokenizer", "isojax.rl.sources", "isojax.run_dir",
        "isojax.run.memory_estimates", "isojax.run.run_inputs", "isojax.run.train",
        "isojax.tasks", "isojax.tasks.prompts")},
    **{("isojax.reproduce.smollm2", target): _CANDIDATES for target in (
        "isojax.run.evaluation",
        "isojax.models.hf_checkpoint", "isojax.models.tokenizer", "isojax.run.run_inputs",
        "isojax.tasks", "isojax.tasks.prompts")},
    **{("isojax.reproduce.gpu", target): (
        "the reproduce command's own process builds the gpu section's random policy (on "
        "the host); every other section loads no model in it") for target in (
        "isojax.models.hf_checkpoint", "isojax.models.transformer")},
    ("isojax.bench.tunix_step", "isojax.models.hf_checkpoint"):
        "trl_step imports tunix_step at module level, and a process that imports "
        "trl_step for its tables (the reproduce command) loads no JAX; the config.json "
        "parser (JAX, flax) loads with the model, in the Tunix side's own process",
    ("launch.bench", "isojax.bench.hf"):
        "torch and transformers load only for the sampling section, the one that measures "
        "Hugging Face",
}

# What the planner may not import: it is pure functions of numbers (no device, no
# config layer, no tokenizer).
PLANNER_FORBIDDEN = ("ml_collections", "isojax.config.config_lib", "jax", "flax")
# The layers below the command line read typed settings, never the config layer.
SETTINGS_READERS = ("isojax.rl", "isojax.sampling", "isojax.models", "isojax.planner",
                    "isojax.tasks", "isojax.base_models", "isojax.run.evaluation",
                    "isojax.run.run_inputs", "isojax.run.run_state", "isojax.run.memory_plan",
                    "isojax.run.memory_estimates", "isojax.run.checkpointing", "isojax.run.workdir_lock",
                    "isojax.run.preemption")
CONFIG_LAYER = ("ml_collections", "isojax.config.config_lib")


@dataclasses.dataclass(frozen=True)
class Import:
  source: str   # the importing module, e.g. "isojax.planner.prescribe"
  target: str   # the imported module (an isojax/launch module, or a third-party name)
  line: int
  in_function: bool


def _module_files() -> dict[str, str]:
  """{module name: file path} of every module under PACKAGES (isojax/configs is a link
  to the top-level configs/: followed, as setuptools follows it)."""
  modules = {}
  for package in PACKAGES:
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, package), followlinks=True):
      dirnames[:] = [d for d in dirnames if d != "__pycache__"]
      for name in filenames:
        if not name.endswith(".py"):
          continue
        path = os.path.join(dirpath, name)
        parts = os.path.relpath(path, ROOT)[:-len(".py")].split(os.sep)
        if parts[-1] == "__init__":
          parts = parts[:-1]
        modules[".".join(parts)] = path
  return modules


def _imported_names(node: ast.AST, module: str, is_package: bool,
                    modules: dict[str, str]) -> list[str]:
  """The modules an import statement names: for `from a import b`, `a.b` when that is a
  module, else `a`."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names]
  assert isinstance(node, ast.ImportFrom)
  if node.level:
    base = module.split(".")
    base = base[:len(base) - node.level + (1 if is_package else 0)]
    origin = ".".join(base + ([node.module] if node.module else []))
  else:
    origin = node.module
  names = [f"{origin}.{alias.name}" for alias in node.names]
  return [name if name in modules else origin for name in names]


def _imports(module: str, path: str, modules: dict[str, str]) -> list[Import]:
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  is_package = path.endswith("__init__.py")
  found = {}

  def visit(node: ast.AST, in_function: bool) -> None:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.Import, ast.ImportFrom)):
        for name in _imported_names(child, module, is_package, modules):
          if name != module and (name, in_function) not in found:
            found[name, in_function] = Import(module, name, child.lineno, in_function)
      visit(child, in_function or isinstance(
          child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

  visit(tree, False)
  return list(found.values())


@functools.cache
def import_graph() -> tuple[Import, ...]:
  modules = _module_files()
  return tuple(imp for name, path in sorted(modules.items())
               for imp in _imports(name, path, modules))


def _internal(name: str) -> bool:
  return name.split(".")[0] in PACKAGES


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
  """One cycle of the directed graph, as [a, b, ..., a], or None."""
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node: str) -> list[str] | None:
    state[node] = 1
    path.append(node)
    for nxt in sorted(edges.get(node, ())):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        cycle = visit(nxt)
        if cycle:
          return cycle
    path.pop()
    state[node] = 2
    return None

  for node in sorted(edges):
    if node not in state:
      cycle = visit(node)
      if cycle:
        return cycle
  return None


def _edges(graph: tuple[Import, ...]) -> dict[str, set[str]]:
  """{module: the isojax/launch modules it imports}. Importing `a.b.c` also runs the
  packages `a` and `a.b`, except those the importing module is inside (Python has
  started them before it)."""
  edges: dict[str, set[str]] = {}
  for imp in graph:
    if not _internal(imp.target):
      continue
    parts = imp.target.split(".")
    for i in range(1, len(parts) + 1):
      name = ".".join(parts[:i])
      if name != imp.source and not imp.source.startswith(name + "."):
        edges.setdefault(imp.source, set()).add(name)
  return edges


def _names(imp: Import, forbidden: tuple[str, ...]) -> bool:
  return any(imp.target == f or imp.target.startswith(f + ".") for f in forbidden)


def _where(imp: Import) -> str:
  kind = "inside a function" if imp.in_function else "at module level"
  return f"{imp.source} (line {imp.line}, {kind}) imports {imp.target}"


# ==================== The checks ====================

def test_the_graph_sees_imports_at_every_level():
  graph = import_graph()
  assert any(i.source == "isojax.run.train" and i.target == "isojax.rl.optimizer" for i in graph)
  assert any(i.in_function for i in graph)  # e.g. matplotlib, loaded when plotting
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": {"c"}}) is None


def test_no_import_cycle_among_modules():
  """Function-level imports included: hoisting one would form the same cycle."""
  cycle = find_cycle(_edges(import_graph()))
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _package(module: str) -> str:
  """isojax.rl.update -> isojax.rl; isojax.config.config_lib -> itself; launch.x -> itself."""
  return ".".join(module.split(".")[:2])


def test_no_import_cycle_among_packages():
  """Each subpackage (isojax.rl, isojax.models, ...) and top-level module is one node."""
  edges: dict[str, set[str]] = {}
  for source, targets in _edges(import_graph()).items():
    for target in targets:
      if _package(source) != _package(target):
        edges.setdefault(_package(source), set()).add(_package(target))
  cycle = find_cycle(edges)
  assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_function_level_imports_of_the_package_are_listed_with_a_reason():
  found = {(i.source, i.target): i for i in import_graph()
           if i.in_function and _internal(i.target)}
  unlisted = [_where(i) for key, i in sorted(found.items())
              if key not in FUNCTION_LEVEL_IMPORTS]
  assert not unlisted, ("imports of isojax/launch modules inside functions (import at "
                        "module level, or list in FUNCTION_LEVEL_IMPORTS with the reason):\n"
                        + "\n".join(unlisted))
  stale = sorted(set(FUNCTION_LEVEL_IMPORTS) - set(found))
  assert not stale, f"FUNCTION_LEVEL_IMPORTS lists imports that no longer exist: {stale}"


def test_the_planner_imports_no_config_layer_and_no_device_library():
  bad = [_where(i) for i in import_graph()
         if i.source.startswith("isojax.planner") and _names(i, PLANNER_FORBIDDEN)]
  assert not bad, "the planner is pure NumPy/SciPy:\n" + "\n".join(bad)


def test_the_planner_reaches_no_config_layer_through_other_modules():
  """What the planner imports, transitively, stays out of the config layer."""
  graph = import_graph()
  edges = _edges(graph)
  seen, todo = set(), [m for m in edges if m.startswith("isojax.planner")]
  while todo:
    node = todo.pop()
    if node not in seen:
      seen.add(node)
      todo += edges.get(node, ())
  bad = [_where(i) for i in graph if i.source in seen and _names(i, PLANNER_FORBIDDEN)]
  assert not bad, "the planner reaches, through the modules it imports:\n" + "\n".join(bad)


def test_the_layers_below_the_command_line_import_no_config_layer():
  """rl/, sampling/, models/, the planner and evaluation receive settings objects."""
  bad = [_where(i) for i in import_graph()
         if i.source.startswith(SETTINGS_READERS) and _names(i, CONFIG_LAYER)]
  assert not bad, "these read typed settings, not the ConfigDict:\n" + "\n".join(bad)


def test_no_binary_imports_another():
  bad = [_where(i) for i in import_graph()
         if i.source.startswith("launch.") and i.target.startswith("launch.")]
  assert not bad, "binaries share code through the package, not each other:\n" + "\n".join(bad)


def test_the_package_imports_no_binary():
  bad = [_where(i) for i in import_graph()
         if i.source.startswith("isojax") and i.target.split(".")[0] == "launch"]
  assert not bad, "the library never imports launch/:\n" + "\n".join(bad)


# A function a reader holds in their head, and a module a reader takes in at a sitting.
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 400


def test_no_function_of_the_package_is_longer_than_a_reader_holds():
  long = []
  for module, path in sorted(_module_files().items()):
    if not module.startswith("isojax"):
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    long += [f"{path}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
             for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
  assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into parts):\n"
                    + "\n".join(long))


def test_no_module_of_the_package_is_longer_than_a_reader_takes_in():
  long = []
  for module, path in sorted(_module_files().items()):
    if module.startswith("isojax"):
      with open(path) as f:
        lines = sum(1 for _ in f)
      if lines > MAX_MODULE_LINES:
        long.append(f"{path}: {lines} lines")
  assert not long, (f"modules over {MAX_MODULE_LINES} lines (split them by job):\n"
                    + "\n".join(long))


def _room_edges() -> dict[str, set[str]]:
  """Each room of isojax (subpackage or top-level module) -> the rooms it imports."""
  edges: dict[str, set[str]] = {}
  for source, targets in _edges(import_graph()).items():
    for target in targets:
      if (source.startswith("isojax.") and _package(source) != _package(target)
          and _package(target) != "isojax"):
        edges.setdefault(_package(source), set()).add(_package(target))
  return edges


def _room_levels() -> dict[str, int]:
  """Each room and its layer: 0 for a room that imports no other, else one above the
  highest room it imports."""
  edges = _room_edges()
  rooms = {_package(m) for m in _module_files() if m.startswith("isojax.")}
  level: dict[str, int] = {}

  def visit(room: str) -> int:
    if room not in level:
      level[room] = 1 + max((visit(t) for t in edges.get(room, ())), default=-1)
    return level[room]
  return {room: visit(room) for room in sorted(rooms)}


def _page_block(name: str) -> str:
  with open(os.path.join(ROOT, "docs", "architecture.md")) as f:
    page = f.read()
  return page.split(f"<!-- {name}:begin -->\n")[1].split(f"\n<!-- {name}:end -->")[0]


def test_the_architecture_page_lists_every_room_at_its_level():
  """docs/architecture.md's table of rooms by layer is the import graph's."""
  levels = _room_levels()
  rows = [f"| {n} | " + ", ".join(f"`{r}`" for r in levels if levels[r] == n) + " |"
          for n in sorted(set(levels.values()))]
  expected = "\n".join(["| level | rooms |", "|---|---|", *rows])
  assert _page_block("rooms") == expected, (
      "docs/architecture.md's rooms table is stale; it should read:\n" + expected)


def test_the_architecture_page_draws_every_arrow_between_rooms():
  """docs/architecture.md's arrows: each room of a subpackage and the rooms it imports."""
  edges, levels = _room_edges(), _room_levels()
  short = lambda room: room.removeprefix("isojax.")
  rows = [f"{short(room):<14} -> " + ", ".join(sorted(map(short, edges[room]),
                                                      key=lambda r: (-levels["isojax." + r], r)))
          for room in sorted(edges, key=lambda r: (-levels[r], r))]
  expected = "\n".join(["```", *rows, "```"])
  assert _page_block("arrows") == expected, (
      "docs/architecture.md's arrows are stale; they should read:\n" + expected)
