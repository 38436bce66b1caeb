"""The app's icons, rendered from resources/icons/*.svg (see render.py there)."""

from __future__ import annotations

from functools import cache

from PySide6.QtGui import QIcon

from engine.resources import resources_dir

SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
TRAY_STATES = ("contributing", "paused", "waiting", "error")


@cache
def icon(name: str) -> QIcon:
    """``cotrain`` (the app) or ``tray-<state>``, with every rendered size for crisp scaling."""
    folder = resources_dir() / "icons" / "png"
    result = QIcon()
    for size in SIZES:
        path = folder / f"{name}-{size}.png"
        if path.exists():
            result.addFile(str(path))
    if result.isNull():
        raise FileNotFoundError(f"no icon {name!r} in {folder}")
    return result
