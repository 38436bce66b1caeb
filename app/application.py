"""Wiring: the controller, the main window, the tray (where there is one), the single-instance
server, and quitting once the worker has left cleanly."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QSystemTrayIcon

from app.controller import Controller
from app.instance import InstanceServer
from app.trayicon import TrayIcon
from app.window import MainWindow

SIGNAL_POLL_MS = 300  # lets Python run its signal handlers (Ctrl-C) while Qt's loop spins


class CotrainApp(QObject):
    finished = Signal()  # the worker has left: the process may end (app/main.py exits then)

    def __init__(self, controller: Controller | None = None, tray: bool | None = None,
                 single_instance: bool = True) -> None:
        super().__init__()
        self.controller = controller or Controller(parent=self)
        self.has_tray = QSystemTrayIcon.isSystemTrayAvailable() if tray is None else tray
        self.window = MainWindow(self.controller, self.has_tray)
        self.tray = TrayIcon(self.controller, self.open_page) if self.has_tray else None
        self.instance = InstanceServer(self) if single_instance else None
        if self.instance is not None:
            self.instance.message.connect(lambda message: self.open_page("dashboard"))
        self.window.quit_requested.connect(self.controller.quit)
        self.controller.manager.stopped.connect(self.finished)
        if self.tray is None:
            self.controller.notice.connect(
                lambda title, text, kind: self.window.statusBar().showMessage(text, 15_000))
        self._signals = QTimer(self, interval=SIGNAL_POLL_MS)
        self._signals.timeout.connect(lambda: None)

    def start(self) -> None:
        first_run = self.controller.store.first_run
        self.controller.start()
        self._signals.start()
        if self.tray is not None:
            self.tray.show()
        if self.tray is None or first_run:
            self.open_page("dashboard")
        elif self.tray.supportsMessages():
            self.tray.showMessage("Cotrain", "Cotrain runs in the tray. Click the icon to open it.",
                                  QSystemTrayIcon.MessageIcon.Information, 5000)

    def open_page(self, page: str) -> None:
        self.window.show_page(page)
