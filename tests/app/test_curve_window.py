"""`cotrain project curve` at a display: the curve in a window as the dashboard draws it (the
training loss of every step, the held-out loss where scored), back to the terminal once the
window is closed; a script reading the command's output gets no window."""

from __future__ import annotations

import sys

import numpy as np
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app import curve_window
from engine.authoring.curve import curve_window as window_here
from engine.wire.rest import Curve, CurvePoint


def point(epoch: int, heldout: float | None = None) -> CurvePoint:
    return CurvePoint(epoch=epoch, loss=6.0 - epoch / 10, samples=256, peers=2, round_seconds=0.5,
                      finished_at=1.8e9 + epoch, heldout_loss=heldout)


def test_the_window_plots_both_losses_and_returns_once_closed(qtbot):
    app = QApplication.instance()
    app.setQuitOnLastWindowClosed(False)  # (as the tray app has it: closing a window is no quit)
    curve = Curve("my-project", [point(e, 5.5 - e / 10 if e % 10 == 0 else None) for e in range(1, 26)])
    seen: dict = {}

    def look_then_close() -> None:
        windows = [w for w in QApplication.topLevelWidgets()
                   if isinstance(w, curve_window.CurveWindow) and w.isVisible()]
        try:
            seen["title"] = windows[0].windowTitle()
            seen["lines"] = {item.name(): item.getData()
                             for item in windows[0].centralWidget().getPlotItem().listDataItems()}
        finally:
            for window in windows:
                window.close()

    QTimer.singleShot(0, look_then_close)
    try:
        curve_window.show(curve, "my-project: learning curve")
    finally:
        app.setQuitOnLastWindowClosed(True)
    assert seen["title"] == "my-project: learning curve"
    steps, losses = seen["lines"]["training loss"]
    assert list(steps) == list(range(1, 26)) and np.allclose(losses, [6.0 - e / 10 for e in range(1, 26)])
    scored, heldout = seen["lines"]["held-out loss"]
    assert list(scored) == [10, 20] and np.allclose(heldout, [4.5, 3.5])


def test_a_window_only_for_a_person_at_a_display(monkeypatch):
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    assert window_here() is None  # (a script, or a test, reads the output)
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert window_here() is curve_window.show
    if sys.platform.startswith("linux"):
        monkeypatch.delenv("DISPLAY")
        monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
        assert window_here() is None  # (over SSH: the table alone)
