"""Where Cotrain's bundled files live, from a source checkout or a frozen app."""

from __future__ import annotations

import sys
from pathlib import Path


def resources_dir() -> Path:
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources"
    return Path(__file__).resolve().parent.parent / "resources"


def default_catalog() -> Path:
    return resources_dir() / "catalog.json"
