"""Render every SVG here to PNGs at the sizes desktops ask for (``png/NAME-SIZE.png``),
and the app icon as ``cotrain.ico`` (Windows) and ``cotrain.icns`` (macOS) for the installers.

    python resources/icons/render.py

The PNGs are committed: tray hosts and installers want bitmaps, and rendering at start-up
would cost the app time. Rerun after editing an SVG.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
HERE = Path(__file__).resolve().parent


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication, QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    QGuiApplication(sys.argv)
    out = HERE / "png"
    out.mkdir(exist_ok=True)
    for svg in sorted(HERE.glob("*.svg")):
        renderer = QSvgRenderer(str(svg))
        if not renderer.isValid():
            print(f"{svg.name}: not a valid SVG", file=sys.stderr)
            return 1
        for size in SIZES:
            image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
            image.fill(Qt.GlobalColor.transparent)
            painter = QPainter(image)
            painter.setRenderHint(QPainter.RenderHint.Antialiasing)
            renderer.render(painter)
            painter.end()
            image.save(str(out / f"{svg.stem}-{size}.png"))
            if svg.stem == "cotrain" and size == 256:
                image.save(str(HERE / "cotrain.ico"))
            if svg.stem == "cotrain" and size == 512:
                image.save(str(HERE / "cotrain.icns"))
    print(f"rendered {len(list(HERE.glob('*.svg')))} icons at {len(SIZES)} sizes into {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
