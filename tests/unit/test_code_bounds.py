"""Code a reader can hold: no module over 400 lines, no class over 25 methods, no function
over 80 lines, in everything we ship and test. A feature that would break a bound splits a
module (or a class, or a function) instead of growing it."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app", "installers", "tests")
MAX_MODULE_LINES = 400
MAX_METHODS = 25
MAX_FUNCTION_LINES = 80


def _sources() -> list[Path]:
    return [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]


def _over_bounds(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    name = str(path.relative_to(root))
    over = []
    if (lines := len(text.splitlines())) > MAX_MODULE_LINES:
        over.append(f"{name}: {lines} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            methods = [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
            if len(methods) > MAX_METHODS:
                over.append(f"{name}: class {node.name} has {len(methods)} methods")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            assert node.end_lineno is not None
            if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                over.append(f"{name}:{node.lineno}: {node.name} is {length} lines")
    return over


def test_no_module_class_or_function_outgrows_its_bound():
    sources = _sources()
    assert len(sources) > 300  # the walk saw the code
    assert [problem for path in sources for problem in _over_bounds(path)] == []


def test_the_bounds_catch_what_outgrows_them(tmp_path):
    methods = "".join(f"    def m{i}(self):\n        return {i}\n" for i in range(MAX_METHODS + 1))
    long_body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    module = tmp_path / "big.py"
    module.write_text(f"class Big:\n{methods}\n\ndef long():\n{long_body}" + "\n" * MAX_MODULE_LINES)
    problems = [p.split(": ", 1)[1] for p in _over_bounds(module, tmp_path)]
    assert problems == [f"{len(module.read_text().splitlines())} lines",
                        f"class Big has {MAX_METHODS + 1} methods", f"long is {MAX_FUNCTION_LINES + 1} lines"]

