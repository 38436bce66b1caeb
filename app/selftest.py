"""The desktop app's part of ``cotrain --self-test``: Qt's platform plugin and a plot."""

from __future__ import annotations

import os
import sys


def check_qt() -> str:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import pyqtgraph
    from PySide6 import __version__ as pyside_version
    from PySide6.QtWidgets import QApplication, QLabel

    app = QApplication.instance() or QApplication([])
    label = QLabel("Cotrain self-test")
    plot = pyqtgraph.PlotWidget()
    plot.plot([0, 1, 2], [3, 1, 2])
    label.show()
    plot.show()
    app.processEvents()
    image = plot.grab()
    lost = _references_lost_painting(plot)
    label.close()
    plot.close()
    if image.isNull() or image.width() == 0:
        raise RuntimeError("the window could not be drawn")
    if lost > LOST_ALLOWED:
        raise RuntimeError(f"PySide6 {pyside_version} loses references to None while painting ({lost} in "
                           f"{PAINTS} paints): the app would abort within minutes; install another release")
    platform = app.platformName() if isinstance(app, QApplication) else "?"
    return f"{platform} window and plot drawn {PAINTS} times (PySide6 {pyside_version})"


PAINTS = 20
LOST_ALLOWED = 500  # a broken release loses thousands (see tests/app/test_painting.py)
_KEPT: list[None] = []


def _references_lost_painting(plot) -> int:
    """How many references to None painting the plot again and again lost (0 where None is
    immortal, Python 3.12 on). What was lost is given back, so the check cannot abort us."""
    if sys.version_info >= (3, 12):
        return 0
    before = sys.getrefcount(None)
    for i in range(PAINTS):
        plot.plot([0, 1, 2], [i, 1, 2], clear=True)
        plot.grab()
    lost = before - sys.getrefcount(None)
    _KEPT.extend([None] * max(lost, 0))
    return lost


CHECKS = [("qt", check_qt)]
