"""A project folder's manifest: the ``data`` of its project.json, written from the files in
``shards/``, ``heldout/``, ``tokenizer.json`` and ``initial.safetensors`` (their sizes and
sha256)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.project_folders import PROJECT_FILE
from engine.shards.download import hash_file

IMAGE_TASK = "image-classification"
SHARDS, HELDOUT, TOKENIZER, INITIAL_WEIGHTS = "shards", "heldout", "tokenizer.json", "initial.safetensors"


def file_entry(root: Path, path: Path) -> dict[str, Any]:
    return {"path": path.relative_to(root).as_posix(), "sha256": hash_file(path).hexdigest(),
            "bytes": path.stat().st_size}


def _image_entry(root: Path, path: Path) -> dict[str, Any]:
    """An image shard's entry, with its image count: peers size their memory by it."""
    from engine.tasks.image_shards import count_images  # (Pillow and torch, for image projects only)

    return file_entry(root, path) | {"examples": count_images(path)}


def read_project(root: Path) -> dict[str, Any]:
    try:
        project = json.loads((root / PROJECT_FILE).read_text())
    except FileNotFoundError:
        raise ValueError(f"{root} has no {PROJECT_FILE}: start with `cotrain project new`") from None
    except ValueError as exc:
        raise ValueError(f"{root / PROJECT_FILE} is not valid JSON: {exc}") from None
    if not isinstance(project, dict):
        raise ValueError(f"{root / PROJECT_FILE} is not a JSON object")
    return project


def write_project(root: Path, project: dict[str, Any]) -> None:
    (root / PROJECT_FILE).write_text(json.dumps(project, indent=2) + "\n")


def update_manifest(root: Path) -> dict[str, Any]:
    """Rewrite the project's ``data`` from the files in its folder; returns it."""
    project = read_project(root)
    entry = _image_entry if project.get("task") == IMAGE_TASK else file_entry
    data: dict[str, Any] = {
        "shards": [entry(root, p) for p in sorted((root / SHARDS).glob("*")) if p.is_file()],
        "heldout": [entry(root, p) for p in sorted((root / HELDOUT).glob("*")) if p.is_file()],
    }
    for key, name in (("tokenizer", TOKENIZER), ("initial_weights", INITIAL_WEIGHTS)):
        if (root / name).is_file():
            data[key] = file_entry(root, root / name)
    project["data"] = data
    write_project(root, project)
    return data
