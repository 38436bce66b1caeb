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


# Modules of one name in two places, each the same idea seen from two sides.
SAME_IDEA = {
    "selftest.py": {"engine/selftest.py", "app/selftest.py"},  # the engine's checks, the app's
    "main.py": {"app/main.py", "engine/worker/main.py"},  # the two processes' entry points
    "groups.py": {"engine/planning/groups.py", "engine/wire/groups.py"},  # a grouped round: planned, sent
    "ice.py": {"engine/backbone/ice.py", "engine/transport/ice.py"},  # ICE servers: handed out, used
    "heldout.py": {"engine/authoring/heldout.py", "engine/backbone/tracker/heldout.py"},  # chosen, scored
    "text_shards.py": {"engine/authoring/text_shards.py", "engine/tasks/text_shards.py"},  # cut, read
    "image_shards.py": {"engine/authoring/image_shards.py", "engine/tasks/image_shards.py"},  # cut, read
}


def test_no_two_modules_share_a_name_unless_they_are_one_idea():
    """A reader who meets ``records.py`` knows which records (issue 52: the word meant the
    database's repositories, the tracker's punishments and DNS TXT records)."""
    where = defaultdict(set)
    for package in ("engine", "app"):
        for path in (ROOT / package).rglob("*.py"):
            if path.name != "__init__.py":
                where[path.name].add(str(path.relative_to(ROOT)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert shared == SAME_IDEA
