"""Real text available offline: the Python standard library's sources, or a folder of text files."""

from __future__ import annotations

import logging
import os
import sysconfig
from pathlib import Path

import torch

log = logging.getLogger(__name__)
TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst", ".json", ".toml", ".cfg", ".ini", ".html", ".c", ".h"}


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def load_corpus(data_dir: str | None, max_bytes: int) -> torch.Tensor:
    """Bytes of the corpus as a uint8 tensor, files in sorted order, at most ``max_bytes``.

    Without ``data_dir`` the stdlib's ``.py`` files are used; with it, every text file
    under it (files containing NUL bytes are skipped as binary).
    """
    root = Path(data_dir) if data_dir else stdlib_dir()
    if not root.is_dir():
        raise ValueError(f"data folder {root} does not exist")
    pattern = "*.py" if data_dir is None else "*"
    chunks, total = [], 0
    for path in sorted(root.rglob(pattern)):
        if total >= max_bytes:
            break
        if not path.is_file() or (data_dir and path.suffix.lower() not in TEXT_SUFFIXES):
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data:
            continue
        data = data[: max_bytes - total]
        chunks.append(data)
        total += len(data)
    if total < 4096:
        raise ValueError(f"not enough text under {root} ({total} bytes)")
    log.info("corpus: %.1f MB from %s", total / 1e6, root)
    return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)


def corpus_bytes_limit() -> int:
    return int(os.environ.get("COTRAIN_CORPUS_BYTES", 16 * 1024 * 1024))
