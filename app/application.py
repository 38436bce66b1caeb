"""Wiring: the controller, the main window, the tray (where there is one), the single-instance
server, and quitting once the worker has left cleanly."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QSystemTrayIcon

from app.controller import Controller
from app.instance import InstanceServer
from app.trayicon import TrayIcon
from app.window import MainWindow

SIGNAL_POLL_MS = 300  # lets Python run its signal handlers (Ctrl-C) while Qt's loop spins
# At login the desktop's panel (and its tray) may come up after Cotrain: started in the
# background (start at login), it waits this long for a tray before opening its window as
# the app. Whenever a tray appears later, the icon docks there.
TRAY_WAIT_MS = 30_000
TRAY_LOOK_MS = 250
TRAY_LOOK_LATER_MS = 5_000


class CotrainApp(QObject):
    finished = Signal()  # the worker has left: the process may end (app/main.py exits then)

    def __init__(self, controller: Controller | None = None, tray: bool | None = None,
                 single_instance: bool = True, background: bool = False,
                 tray_available: Callable[[], bool] = QSystemTrayIcon.isSystemTrayAvailable) -> None:
        super().__init__()
        self.controller = controller or Controller(parent=self)
        self.window = MainWindow(self.controller, has_tray=False)
        self.tray: TrayIcon | None = None
        self._tray_available = (lambda: tray) if tray is not None else tray_available
        self._looking = QTimer(self, interval=TRAY_LOOK_MS)
        self._looking.timeout.connect(self._look_for_tray)
        self._waited_ms = 0
        self._background = background  # started at login: in the tray, once there is one
        self.instance = InstanceServer(self) if single_instance else None
        if self.instance is not None:
            self.instance.message.connect(lambda message: self.open_page("dashboard"))
        self.window.quit_requested.connect(self.controller.quit)
        self.controller.manager.stopped.connect(self.finished)
        self.controller.notice.connect(self._notice_without_tray)
        self._signals = QTimer(self, interval=SIGNAL_POLL_MS)
        self._signals.timeout.connect(lambda: None)

    @property
    def has_tray(self) -> bool:
        return self.tray is not None

    def start(self) -> None:
        first_run = self.controller.store.first_run
        self.controller.start()
        self._signals.start()
        if self._tray_available():
            self._dock(greet=not first_run)
        else:
            self._looking.start()
        if first_run:
            self.window.show_welcome()  # nothing trains before the user says how
        elif not self.has_tray and not self._background:
            self.open_page("dashboard")  # the window is the app until a tray comes up

    def _look_for_tray(self) -> None:
        if self._tray_available():
            self._looking.stop()
            self._dock(greet=not self.window.isVisible())
            return
        self._waited_ms += self._looking.interval()
        if self._waited_ms >= TRAY_WAIT_MS and self._looking.interval() == TRAY_LOOK_MS:
            self._looking.setInterval(TRAY_LOOK_LATER_MS)
            if not self.window.isVisible():
                self.open_page("dashboard")  # no tray came: the window is the app

    def _dock(self, greet: bool) -> None:
        self.tray = TrayIcon(self.controller, self.open_page)
        self.window.has_tray = True
        self.tray.show()
        if greet and self.tray.supportsMessages():
            self.tray.showMessage("Cotrain", "Cotrain runs in the tray. Click the icon to open it.",
                                  QSystemTrayIcon.MessageIcon.Information, 5000)

    def _notice_without_tray(self, title: str, text: str, kind: str) -> None:
        if self.tray is None:
            self.window.statusBar().showMessage(text, 15_000)

    def open_page(self, page: str) -> None:
        self.window.show_page(page)
