"""The design documents stay true to the code they describe: the overview stays short, the
round's walk names only modules (and their classes and functions) that exist, and every
link between the documents leads somewhere."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OVERVIEW = ROOT / "engine" / "ARCHITECTURE.md"
DOCS = ROOT / "engine" / "docs"
MAX_OVERVIEW_LINES = 300


def _section(text: str, title: str) -> str:
    return text.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _names_in(path: Path) -> set[str]:
    defined = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, defined)}


def test_the_overview_stays_an_overview():
    assert len(OVERVIEW.read_text().splitlines()) <= MAX_OVERVIEW_LINES


def test_the_rounds_walk_names_what_the_code_holds():
    walk = _section(OVERVIEW.read_text(), "A round in the code, top to bottom")
    steps = re.findall(r"^(\d+)\. \*\*", walk, re.M)
    assert steps == [str(i) for i in range(1, len(steps) + 1)] and len(steps) >= 8, "one numbering"
    modules = re.findall(r"`([a-z_/]+\.py)`(?: `([A-Za-z_.]+)`)?", walk)
    assert len(modules) >= 10
    for module, name in modules:
        path = ROOT / "engine" / module
        assert path.is_file(), f"the walk names engine/{module}, which is not there"
        if name:  # (a class's method as Class.method)
            assert set(name.split(".")) <= _names_in(path), f"the walk names {name} in engine/{module}"


def test_every_link_between_the_documents_leads_somewhere():
    documents = [OVERVIEW, *sorted(DOCS.glob("*.md")), ROOT / "README.md"]
    assert len(documents) > 10
    linked = set()
    for document in documents:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", document.read_text()):
            path = (document.parent / target).resolve()
            assert path.exists(), f"{document.relative_to(ROOT)} links to {target}, which is not there"
            linked.add(path)
    assert {p.resolve() for p in DOCS.glob("*.md")} <= linked, "a design note nobody links to"
