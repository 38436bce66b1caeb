"""`cotrain project curve` where a display is: the learning curve in a window of its own, as
the dashboard draws it (the training loss of every step, the held-out loss where peers
scored it), open until it is closed."""

from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtCore import QEventLoop, Signal
from PySide6.QtGui import QCloseEvent
from PySide6.QtWidgets import QApplication, QMainWindow

from app.views.common import HELD_OUT_LOSS, TRAINING_LOSS
from engine.wire.rest import Curve


def curve_plot(curve: Curve, title: str) -> pg.PlotWidget:
    plot = pg.PlotWidget(title=title)
    plot.setBackground("w")
    plot.setLabel("bottom", "step")
    plot.setLabel("left", "loss")
    plot.showGrid(x=True, y=True, alpha=0.3)
    plot.addLegend(offset=(-10, 10))  # (top right: a falling loss leaves it empty)
    trained = [p for p in curve.epochs if p.loss is not None]
    plot.plot([p.epoch for p in trained], [p.loss for p in trained], pen=pg.mkPen(TRAINING_LOSS, width=2),
              name="training loss")
    scored = [p for p in curve.epochs if p.heldout_loss is not None]
    plot.plot([p.epoch for p in scored], [p.heldout_loss for p in scored],
              pen=pg.mkPen(HELD_OUT_LOSS, width=2), symbol="s", symbolBrush=HELD_OUT_LOSS,
              name="held-out loss")
    return plot


class CurveWindow(QMainWindow):
    closed = Signal()

    def closeEvent(self, event: QCloseEvent) -> None:
        super().closeEvent(event)
        self.closed.emit()


def show(curve: Curve, title: str) -> None:
    """Open the window and return once it is closed: a loop of its own, since the application
    may be one that outlives its windows (the tray app's quitOnLastWindowClosed is off)."""
    QApplication.instance() or QApplication([])
    window = CurveWindow()
    window.setWindowTitle(title)
    window.setCentralWidget(curve_plot(curve, title))
    window.resize(900, 520)
    loop = QEventLoop()
    window.closed.connect(loop.quit)
    window.show()
    loop.exec()
