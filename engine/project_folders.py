"""Project folders: what ``cotrain backbone --projects DIR`` serves, one folder per project.

    DIR/albert-mini/project.json     the project (engine/project.py), its manifest in ``data``
    DIR/albert-mini/tokenizer.json   files the manifest names by path, relative to the folder
    DIR/albert-mini/shards/...

A folder is checked when it is loaded: every file its manifest names exists with the size
it says (hashes are the peers' to check, and ``cotrain project check``'s). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.project import FileRef, ProjectSpec
from engine.wire import ProtocolError
from engine.wire.codec import convert, decode_json

PROJECT_FILE = "project.json"
MAX_PROJECT_FILE = 4 * 1024 * 1024


@dataclass(frozen=True)
class ProjectFolder:
    spec: ProjectSpec
    root: Path

    def local_files(self) -> dict[str, FileRef]:
        """The files this folder serves, by their path in the manifest."""
        data = self.spec.data
        return {f.path: f for f in (data.files() if data else []) if not is_url(f.path)}


def is_url(place: str) -> bool:
    return place.startswith(("http://", "https://"))


def read_project_file(path: Path) -> ProjectSpec:
    """A project.json as a ProjectSpec; ValueError naming the file and the field."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        return convert(decode_json(raw, str(path), MAX_PROJECT_FILE), ProjectSpec, str(path))
    except ProtocolError as exc:
        raise ValueError(str(exc)) from None


def load_project_folder(root: Path) -> ProjectFolder:
    folder = ProjectFolder(read_project_file(root / PROJECT_FILE), root)
    for place, ref in folder.local_files().items():
        path = root / place
        try:
            size = path.stat().st_size
        except OSError:
            raise ValueError(f"{root / PROJECT_FILE} lists {place}, which is not in {root}") from None
        if size != ref.bytes:
            raise ValueError(f"{path} has {size} bytes; {root / PROJECT_FILE} says {ref.bytes}")
    return folder


def load_project_folders(directory: Path) -> list[ProjectFolder]:
    """Every folder of ``directory`` that holds a project.json, in name order."""
    if not directory.is_dir():
        raise ValueError(f"projects folder {directory} does not exist")
    folders = [load_project_folder(d) for d in sorted(directory.iterdir()) if (d / PROJECT_FILE).is_file()]
    if not folders:
        raise ValueError(f"no project in {directory}: each project is a folder with a {PROJECT_FILE}")
    return folders
