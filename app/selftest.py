"""The desktop app's part of ``cotrain --self-test``: Qt's platform plugin and a plot."""

from __future__ import annotations

import os


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
    label.close()
    plot.close()
    if image.isNull() or image.width() == 0:
        raise RuntimeError("the window could not be drawn")
    platform = app.platformName() if isinstance(app, QApplication) else "?"
    return f"{platform} window and plot drawn (PySide6 {pyside_version})"


CHECKS = [("qt", check_qt)]
