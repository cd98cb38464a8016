"""The import structure: no circle, every folder imports only what ``docs/design.md`` allows it, the TF back end
reads bottom to top, and an import inside a function says why.

Every module of ``placer/`` and ``cost_models/`` is read with ``ast`` (imports at any depth: in functions,
under ``if TYPE_CHECKING``), an edge per imported project module (``from . import x`` is ``x``; ``from .m
import name`` is ``m``), and ``networkx`` is asked about the graph. That TensorFlow-free modules import in a
process without TensorFlow is checked by running them: ``tests/test_replan.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("placer", "cost_models")
#: Folder (module prefix) → the project folders it may import (besides itself). The order of the stages:
#: ``docs/design.md``, "Which folder may import which".
MAY_IMPORT = {
    "cost_models": (),
    "placer.errors": (),
    "placer.core": ("cost_models", "placer.errors"),
    "placer.solvers": ("cost_models", "placer.errors", "placer.core"),
    "placer.planner": ("cost_models", "placer.errors", "placer.core", "placer.solvers"),
    "placer.reporting": ("placer.errors", "placer.core"),
    "placer.measure": ("cost_models", "placer.errors", "placer.core"),
    "placer.tf": ("cost_models", "placer.errors", "placer.core", "placer.solvers", "placer.planner",
                  "placer.reporting", "placer.measure"),
    "placer.cli": ("cost_models", "placer", "placer.errors", "placer.core", "placer.solvers", "placer.planner",
                   "placer.reporting", "placer.tf"),
    "placer": ("placer.errors", "placer.core"),  # the package's __init__: the rest is imported lazily, by name
}
#: The TensorFlow back end, bottom to top: a module imports only modules of its layer or below.
TF_LAYERS = (
    ("placer.tf.graphdef",),
    ("placer.tf.trace", "placer.tf.remote", "placer.tf.codecs"),
    ("placer.tf.opgraph", "placer.tf.timing", "placer.tf.replicas", "placer.tf.training"),
    ("placer.tf.costs", "placer.tf.rewrites"),
    ("placer.tf.emit",),
    ("placer.tf.report", "placer.tf.export", "placer.tf.measuring"),
    ("placer.tf.placement",),
    ("placer.tf.placed_model", "placer.tf.options"),
    ("placer.tf.runner",),
)
#: What an import inside a function must say, on its line or the line above, to be allowed.
LAZY = "lazy:"


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, int, bool]]:
    """``(project module imported, line, inside a function)`` of every import statement of one module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(fn)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in MODULES else module
                       for alias in node.names]
        else:
            continue
        for target in dict.fromkeys(targets):
            while target and target not in MODULES:  # `import a.b.c` of a name inside a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.append((target, node.lineno, id(node) in inside))
    return out


def import_graph() -> nx.DiGraph:
    """Project module → the project modules it imports (edge attribute ``lines``)."""
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for name, path in MODULES.items():
        for target, line, _ in _imports(name, path):
            g.add_edge(name, target)
            g.edges[name, target].setdefault("lines", []).append(line)
    return g


def _folder(module: str, folders) -> str:
    return max((f for f in folders if module == f or module.startswith(f + ".")), key=len)


def test_the_import_graph_is_found():
    g = import_graph()
    assert g.has_edge("placer.tf.runner", "placer.tf.placed_model")
    assert g.has_edge("placer.solvers.auto", "placer.solvers.heavy")  # `from . import heavy` is heavy
    assert g.has_edge("placer.cli", "placer.tf.runner")  # imported inside a function
    assert not g.has_edge("placer.solvers.auto", "placer.solvers")


def test_no_module_imports_itself_back():
    g = import_graph()
    cycles = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    assert not cycles, f"import circles (imports inside functions count): {cycles}"
    assert nx.is_directed_acyclic_graph(g)


def test_each_folder_imports_only_the_folders_below_it():
    bad = []
    for a, b in import_graph().edges:
        fa, fb = _folder(a, MAY_IMPORT), _folder(b, MAY_IMPORT)
        if fa != fb and fb not in MAY_IMPORT[fa]:
            bad.append(f"{a} -> {b}")
    assert not bad, f"imports the design does not allow ({len(bad)}): {bad[:10]}"


def test_the_tensorflow_back_end_reads_bottom_to_top():
    layer = {m: i for i, members in enumerate(TF_LAYERS) for m in members}

    def layer_of(module: str) -> int | None:
        return next((i for prefix, i in layer.items() if module == prefix or module.startswith(prefix + ".")), None)

    tf_modules = [m for m in MODULES if m.startswith("placer.tf.")]
    unlisted = [m for m in tf_modules if layer_of(m) is None]
    assert not unlisted, f"modules of placer.tf in no layer of TF_LAYERS: {unlisted}"
    g = import_graph()
    upward = [f"{a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})" for a, b in g.edges
              if a in tf_modules and b in tf_modules and layer_of(b) > layer_of(a)]
    assert not upward, f"the back end imports upwards: {upward}"
    assert not [b for b in g.successors("placer.tf.graphdef") if b.startswith("placer.tf")], \
        "the GraphDef base imports nothing of the back end above it"


def test_measure_is_a_toolbox_that_never_calls_back_into_the_back_end():
    g = import_graph()
    back = [(a, b) for a, b in g.edges if a.startswith("placer.measure") and b.startswith("placer.tf")]
    assert not back, back


def test_an_import_inside_a_function_says_why():
    silent = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        for target, line, inside in _imports(name, path):
            said = LAZY in lines[line - 1] or (line > 1 and LAZY in lines[line - 2])
            if inside and not said:
                silent.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not silent, (f"{len(silent)} project imports inside functions without a '# {LAZY} <why>' comment "
                        f"(import at the top, or say why not): {silent[:10]}")


@pytest.mark.parametrize("module", ["placer.core", "placer.solvers", "placer.planner", "placer.reporting",
                                    "cost_models"])
def test_tensorflow_free_folders_do_not_import_tensorflow_at_all(module):
    found = []
    for name, path in MODULES.items():
        if (name == module or name.startswith(module + ".")) and name != "cost_models.profile":
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                found += [f"{name}: {n}" for n in names if n.split(".")[0] in ("tensorflow", "keras")]
    assert not found, found
