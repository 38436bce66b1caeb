"""Modules a reader can follow one way: the import graph of what we ship (engine/, app/,
installers/) has no circle, counting every import but those under ``if TYPE_CHECKING:``
(annotations only) -- a function-level import that closes a circle is still one."""

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app", "installers")


def _modules(root: Path) -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            name = ".".join(path.relative_to(root).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _imports(tree: ast.Module, module: str, is_package: bool, modules: dict[str, Path]) -> Iterator[str]:
    """Every module of ours ``module`` imports, wherever the import stands, bar TYPE_CHECKING
    blocks. ``from package import name`` depends on the submodule if ``name`` is one, else
    on the package."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: len(module.split(".")) - node.level + is_package]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                if (sub := f"{base}.{alias.name}") in modules:
                    yield sub
                elif base in modules:
                    yield base
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules(root)
    graph = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        graph[name] = set(_imports(tree, name, path.name == "__init__.py", modules)) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_what_we_ship_imports_without_a_circle():
    graph = import_graph()
    assert len(graph) > 200 and sum(map(len, graph.values())) > 500  # the walk saw the code
    assert circles(graph) == []


def test_a_circle_is_found_and_annotations_are_not_one(tmp_path):
    package = tmp_path / "engine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from engine import b\n")
    (package / "b.py").write_text("def f():\n    from engine.c import g\n")
    (package / "c.py").write_text("from . import a\n")
    annotations_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine import a\n"
    (package / "d.py").write_text(annotations_only)
    (package / "e.py").write_text("from engine.d import x\nfrom engine import d, thing\n")
    graph = import_graph(tmp_path)
    assert circles(graph) == [["engine.a", "engine.b", "engine.c"]]
    assert graph["engine.d"] == set() and graph["engine.e"] == {"engine.d", "engine"}
