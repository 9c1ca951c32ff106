"""tilelink's modules import each other without a circle: the imports a module runs when it is
loaded (its top-level statements, `if TYPE_CHECKING:` blocks aside) form no cycle, so any
module can be imported first and the layers' one direction (frontend -> ir -> plan ->
schedule -> codegen -> runtime, the op families filling their registries) holds. An import
inside a function runs at its call, after every module has loaded: it is not counted."""

from __future__ import annotations

import ast
from pathlib import Path

import tilelink

PACKAGE = Path(tilelink.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def _targets(name: str, is_package: bool, node) -> list[str]:
    """The dotted names an import statement in module `name` may load: the module, and for
    `from M import x` also `M.x` (x may be a submodule)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    here = name.split(".") if is_package else name.split(".")[:-1]
    if node.level:
        base = here[:len(here) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    return [module] + [f"{module}.{a.name}" for a in node.names]


def _load_time_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of ours its top-level imports load. A package importing its own
    submodules is left out: Python finishes the package's names before a submodule that
    imports them back can run, so that is no circle."""
    graph = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                is_package = path.name == "__init__.py"
                edges |= {t for t in _targets(name, is_package, node)
                          if t in modules and t != name and not t.startswith(name + ".")}
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_circle_and_only_that():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_relative_imports_and_submodules():
    graph = _load_time_graph(_modules())
    # tilelink/ops/gemm/library.py: `from .common import ...` and `from ...ir import spec`
    assert {"tilelink.ops.gemm.common", "tilelink.ir"} <= graph["tilelink.ops.gemm.library"]
    # tilelink/schedule/compose.py imports the lowering contract it composes
    assert "tilelink.schedule.lowering" in graph["tilelink.schedule.compose"]


def test_no_module_imports_itself_back_when_loaded():
    cycles = _cycles(_load_time_graph(_modules()))
    assert cycles == [], ("modules whose top-level imports form a circle (move one import "
                          f"into the function that needs it, or the shared name down a "
                          f"layer): {cycles}")
