"""Per-user folders (XDG on Linux, the usual places on macOS and Windows)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def user_data_dir() -> Path:
    override = os.environ.get("COTRAIN_HOME")
    if override:
        return Path(override)
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home() / "AppData" / "Local")) / "Cotrain"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / "Cotrain"
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "cotrain"


def engine_command() -> list[str]:
    """How to start another engine process: the frozen app itself, or this interpreter."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "engine"]
