"""Project folders for tests, written by the same code as the catalog's and the authoring
commands' (nothing here is hand-made)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.authoring.manifest import read_project, update_manifest, write_project
from engine.catalog_data import builtin_folder
from engine.project_folders import ProjectFolder, load_project_folder


def albert_folder(root: Path, **changes: Any) -> ProjectFolder:
    """The catalog's albert-mini in ``root/albert-mini``, with top-level fields changed
    (``task_params`` entries are merged)."""
    return catalog_folder(root, "albert-mini", **changes)


def catalog_folder(root: Path, name: str, **changes: Any) -> ProjectFolder:
    """The catalog's project ``name`` in ``root/name``, changed as ``albert_folder`` does."""
    folder = builtin_folder(root, name)
    assert folder is not None, f"{name} could not be written"
    project = read_project(folder.root)
    params = changes.pop("task_params", {})
    project["task_params"].update(params)
    project.update(json.loads(json.dumps(changes)))
    write_project(folder.root, project)
    update_manifest(folder.root)
    return load_project_folder(folder.root)
