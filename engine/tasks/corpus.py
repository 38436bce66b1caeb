"""Real text available offline: the Python standard library's sources, or a folder of text files.

A frozen app has no stdlib sources on disk; it ships the same files, in the same order, in
``resources/corpus/stdlib-py.zip`` (written by ``write_stdlib_zip`` when it is built).
"""

from __future__ import annotations

import logging
import os
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.resources import resources_dir

log = logging.getLogger(__name__)
DEFAULT_CORPUS_BYTES = 16 * 1024 * 1024
TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".toml", ".cfg", ".ini", ".html", ".c", ".h"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def bundled_stdlib_zip() -> Path:
    return resources_dir() / "corpus" / "stdlib-py.zip"


def _stdlib_files(max_bytes: int):
    """(relative name, bytes) of the stdlib's .py files in sorted order, up to ``max_bytes``."""
    frozen = bundled_stdlib_zip()
    if getattr(sys, "frozen", False) and frozen.exists():
        with zipfile.ZipFile(frozen) as archive:
            for name in archive.namelist():  # written in the order the loader reads
                yield name, archive.read(name)
        return
    root = stdlib_dir()
    if not root.is_dir():
        raise ValueError(f"data folder {root} does not exist")
    total = 0
    for path in sorted_py_files(root):
        if total >= max_bytes:
            return
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.is_file() and b"\0" not in data:
            total += len(data)
            yield path.relative_to(root).as_posix(), data


def sorted_py_files(root: Path) -> Iterator[Path]:
    """The ``.py`` files under ``root`` in the order of ``sorted(root.rglob("*.py"))``, found
    as they are needed: the corpus wants the first megabytes, and sorting a listing of the
    whole standard library (13,000 files) took 0.8 s of every peer's start."""
    try:
        with os.scandir(root) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from sorted_py_files(Path(entry.path))
        elif entry.name.endswith(".py"):
            yield Path(entry.path)


def write_stdlib_zip(target: Path, max_bytes: int | None = None) -> Path:
    """Pack the stdlib sources the default corpus reads, for a frozen app to ship."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, data in _stdlib_files(max_bytes or corpus_bytes_limit()):
            archive.writestr(name, data)
    return target


def load_corpus(data_dir: str | None, max_bytes: int) -> torch.Tensor:
    """Bytes of the corpus as a uint8 tensor, files in sorted order, at most ``max_bytes``.

    Without ``data_dir`` the stdlib's ``.py`` files are used; with it, every text file
    under it (files containing NUL bytes are skipped as binary).
    """
    root = Path(data_dir) if data_dir else stdlib_dir()
    files = _stdlib_files(max_bytes) if data_dir is None else _text_files(root)
    chunks, total = [], 0
    for _, data in files:
        if total >= max_bytes:
            break
        data = data[: max_bytes - total]
        chunks.append(data)
        total += len(data)
    if total < 4096:
        raise ValueError(f"not enough text under {root} ({total} bytes)")
    log.info("corpus: %.1f MB from %s", total / 1e6, root)
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def _text_files(root: Path):
    if not root.is_dir():
        raise ValueError(f"data folder {root} does not exist")
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.suffix.lower() not in TEXT_SUFFIXES:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" not in data:
            yield path.relative_to(root).as_posix(), data


def corpus_bytes_limit() -> int:
    return int(os.environ.get("COTRAIN_CORPUS_BYTES", DEFAULT_CORPUS_BYTES))
