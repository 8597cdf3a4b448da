"""The layout of ``service/``: sub-packages in layers, imports pointing down only, no cycles.

Every module of ``service/`` is parsed with :mod:`ast` (never imported); every ``import`` and
``from ... import`` it holds, at module level or inside a function, relative ones resolved, is an
edge to the service module it names. Importing ``service.a.b`` also runs ``service/a/__init__.py``,
so it is an edge to that package too (except from inside it). Imports under ``if TYPE_CHECKING:``
are left out: they are never executed and only name types for annotations (import-linter's
``exclude_type_checking_imports``); a task's signature may name the model version that calls it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

SERVICE = ROOT / "service"
MAX_LINES = 400

# Lowest first: a module may import from its own layer and the layers before it, never after.
LAYERS = (
    "core",  # settings, the domain exceptions, metrics, tracing, logging, the shutdown flag
    "imaging",  # one image: pre-scan, decode, preprocessing spec and resize policies, drawing
    "tasks",  # what a route verb does with a model's outputs (the registry the manifest asks)
    "batching",  # the dynamic batcher, its buffers and clock
    "runtime",  # ORT sessions, manifest, repository, loading, tuning, model control
    "pipeline",  # /v1: a request's images decoded, batched and run
    "v2",  # the Open Inference Protocol's codec and tensor inference
    "http",  # the app factory, middleware, routes, the error mapping
    "process",  # the uvicorn entry point, its connection protocol, the health check
    "__main__",  # python -m service
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SERVICE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree`` at any depth, less those under ``if TYPE_CHECKING:``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _resolve(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _graph() -> dict[str, set[str]]:
    """Service module -> the service modules it imports (packages included, itself excluded)."""
    modules = _modules()

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = _resolve(node, module, is_package)
                names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
            targets.update(t for name in names if name.startswith("service") and (t := known(name)))
        for target in list(targets):  # importing service.a.b runs service/a/__init__.py first
            parts = target.split(".")
            for i in range(2, len(parts)):
                parent = ".".join(parts[:i])
                if not (module == parent or module.startswith(parent + ".")):
                    targets.add(parent)
        targets.discard(module)
        targets.discard("service")  # the root package's __init__ is a docstring
        graph[module] = targets
    return graph


def _layer(module: str) -> int:
    top = module.split(".")[1]
    assert top in LAYERS, f"{module} is in no layer: place service/{top} in LAYERS"
    return LAYERS.index(top)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules (first repeated last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_graph_sees_imports_inside_functions_and_relative_ones() -> None:
    graph = _graph()
    assert "service.tasks" in graph["service.runtime.manifest"]
    assert "service.http.app" in graph["service.process.serve"]  # imported inside a function
    assert {"service.tasks.base", "service.tasks.classification"} <= graph["service.tasks"]
    assert "service.runtime.repository" not in graph["service.tasks.base"]  # TYPE_CHECKING only


def test_no_import_cycle() -> None:
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_imports_point_down_the_layers() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)]}) imports {target} ({LAYERS[_layer(target)]})"
        for module, targets in sorted(_graph().items())
        if module != "service"
        for target in sorted(targets)
        if _layer(target) > _layer(module)
    ]
    assert not upward, "imports from a higher layer:\n" + "\n".join(upward)


def test_every_module_is_under_the_line_limit() -> None:
    long = {name: n for name, path in _modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along a seam): {long}"


def test_no_torch_anywhere_in_service() -> None:
    torch = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                torch += [f"{name}: import {a.name}" for a in node.names if a.name.split(".")[0] == "torch"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
                torch.append(f"{name}: from {node.module}")
    assert not torch, torch


def _design_sections() -> dict[str, set[str]]:
    """DESIGN.md's layer list: ``service/<layer>/`` -> the words of its entry (continuation lines included)."""
    text = (ROOT / "docs" / "DESIGN.md").read_text()
    sections: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in text.splitlines():
        head = re.match(r"service/(\w+)/\s", line)
        if head:
            current = sections.setdefault(head.group(1), set())
        elif current is not None and not line.startswith(" "):
            current = None
        if current is not None:
            current.update(re.findall(r"\w+/?", line))
    return sections


def test_design_names_every_module_of_every_layer() -> None:
    # docs/layout.md says DESIGN.md's list is kept true here; six modules had been added unlisted.
    sections = _design_sections()
    unnamed = []
    for name, path in _modules().items():
        parts = name.split(".")
        if len(parts) != 3 or parts[1] not in LAYERS:  # a layer's own modules and sub-packages
            continue
        package = path.name == "__init__.py"
        if (f"{parts[2]}/" if package else parts[2]) not in sections.get(parts[1], set()):
            unnamed.append(f"service/{parts[1]}/{parts[2]}" + ("/" if package else ".py"))
    assert sections.keys() >= {"core", "imaging", "tasks", "batching", "runtime", "pipeline", "v2", "http", "process"}
    assert not unnamed, f"modules docs/DESIGN.md's layer list does not name: {unnamed}"
