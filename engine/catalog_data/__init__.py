"""The default catalog's projects that carry data. Nothing is downloaded: each folder is
written, the first time a backbone starts, from data installed with Python or a library, and
served like any project folder. One that cannot be written here (a library missing) is not
offered, and the log says why."""

from __future__ import annotations

import importlib
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from engine.authoring.manifest import read_project, write_project
from engine.project_folders import ProjectFolder, load_project_folder

log = logging.getLogger(__name__)
# Project id -> the module and function that write its folder, imported only to write it (a
# backbone without the libraries they need offers the rest).
BUILDERS: dict[str, tuple[str, str]] = {"albert-mini": ("python_docs", "build_albert_mini"),
                                        "digits": ("digits", "build_digits")}


def _builder(name: str) -> Callable[[Path], None]:
    module, function = BUILDERS[name]
    return getattr(importlib.import_module(f"engine.catalog_data.{module}"), function)


def builtin_folder(root: Path, name: str) -> ProjectFolder | None:
    """The project's folder under ``root``, written first if it is missing or damaged."""
    folder = root / name
    try:
        return load_project_folder(folder)
    except ValueError:
        pass
    partial = root / f"{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        _builder(name)(partial)
    except (ImportError, OSError, ValueError) as exc:
        log.warning("the catalog's %s project is not offered: %s", name, exc)
        shutil.rmtree(partial, ignore_errors=True)
        return None
    _record_needs(partial)
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return load_project_folder(folder)


def _record_needs(folder: Path) -> None:
    """What a peer needs for the model, as `cotrain project check` records it, so the
    Projects page shows it before Join -- where this backbone can build the model to
    measure it (one without transformers offers the project without it)."""
    try:
        from engine.authoring.check import measure_needs

        project = read_project(folder)
        project["needs"] = measure_needs(folder)
    except (ImportError, ValueError) as exc:
        log.info("%s: not measuring what a peer needs here: %s", folder.name, exc)
        return
    write_project(folder, project)
