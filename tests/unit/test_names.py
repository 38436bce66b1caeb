"""One name for one idea: no two classes or type aliases of the same name anywhere in the
engine and the app (a reader who meets ``Event`` or a backbone client knows which one is meant)."""

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_two_classes_or_aliases_share_a_name():
    where = defaultdict(list)
    for package in ("engine", "app"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    where[node.name].append(str(path.relative_to(ROOT)))
            for node in tree.body:  # module-level unions such as ``Event = A | B``
                if (isinstance(node, ast.Assign) and isinstance(node.value, ast.BinOp)
                        and isinstance(node.value.op, ast.BitOr)):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            where[target.id].append(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert shared == {}
    assert len(where) > 100  # the walk saw the code
