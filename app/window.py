"""The main window: a sidebar of pages. With a tray, closing it only hides it; without one,
the window is the app, and closing it asks whether to keep contributing in the background."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QCloseEvent, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QMainWindow,
    QMessageBox,
    QStackedWidget,
    QWidget,
)

from app.controller import Controller
from app.icons import icon
from app.views.account import AccountPage
from app.views.dashboard import DashboardPage
from app.views.leaderboard import LeaderboardPage
from app.views.projects import ProjectsPage
from app.views.settings import SettingsPage
from app.views.welcome import WelcomePage

PAGES = (("dashboard", "Dashboard"), ("projects", "Projects"), ("leaderboard", "Leaderboard"),
         ("account", "Account"), ("settings", "Settings"))


class MainWindow(QMainWindow):
    quit_requested = Signal()

    def __init__(self, controller: Controller, has_tray: bool) -> None:
        super().__init__()
        self.controller = controller
        self.has_tray = has_tray
        self.setWindowTitle("Cotrain")
        self.setWindowIcon(icon("cotrain"))
        self.resize(1020, 720)
        self.pages = {
            "dashboard": DashboardPage(controller),
            "projects": ProjectsPage(controller),
            "leaderboard": LeaderboardPage(controller),
            "account": AccountPage(controller),
            "settings": SettingsPage(controller),
        }
        self.nav = QListWidget()
        self.nav.setFixedWidth(160)
        self.nav.setStyleSheet("QListWidget { border: none; background: transparent; outline: 0; }"
                               "QListWidget::item { padding: 9px 12px; border-radius: 6px; }"
                               "QListWidget::item:selected { background: palette(highlight); "
                               "color: palette(highlighted-text); }")
        self.stack = QStackedWidget()
        for i, (key, title) in enumerate(PAGES):
            self.nav.addItem(title)
            self.stack.addWidget(self.pages[key])
            shortcut = QShortcut(QKeySequence(f"Ctrl+{i + 1}"), self)
            shortcut.activated.connect(lambda k=key: self.show_page(k))
        self.welcome = WelcomePage(controller)
        self.stack.addWidget(self.welcome)  # the first run's screen: no page beside it
        self.nav.currentRowChanged.connect(self.stack.setCurrentIndex)
        self.nav.currentRowChanged.connect(self._titled)
        self.nav.setCurrentRow(0)
        controller.welcomed.connect(self._welcomed)
        QShortcut(QKeySequence(QKeySequence.StandardKey.Quit), self, self.quit_requested.emit)
        body = QWidget()
        layout = QHBoxLayout(body)
        layout.addWidget(self.nav)
        layout.addWidget(self.stack, 1)
        self.setCentralWidget(body)

    def show_welcome(self) -> None:
        self.nav.hide()
        self.stack.setCurrentWidget(self.welcome)
        self.setWindowTitle("Welcome — Cotrain")
        self.showNormal()
        self.raise_()
        self.activateWindow()

    def _welcomed(self) -> None:
        self.nav.show()
        self.show_page("dashboard")

    def _titled(self, row: int) -> None:
        """The page in the title, as the taskbar and window switchers show it."""
        if row >= 0:
            self.setWindowTitle(f"{PAGES[row][1]} — Cotrain")

    def show_page(self, key: str) -> None:
        row = [k for k, _ in PAGES].index(key)
        self.nav.setCurrentRow(row)
        self.stack.setCurrentIndex(row)  # (the row may not have changed: after the first run's screen)
        self._titled(row)
        self.showNormal()
        self.raise_()
        self.activateWindow()

    @property
    def current_page(self) -> str:
        if self.stack.currentWidget() is self.welcome:
            return "welcome"
        return PAGES[self.stack.currentIndex()][0]

    def ask_keep_running(self) -> str:
        """'background', 'quit' or 'cancel'."""
        box = QMessageBox(QMessageBox.Icon.Question, "Keep contributing?",
                          "Keep contributing in the background after closing this window?\n\n"
                          "Run Cotrain again to reopen the window.", parent=self)
        keep = box.addButton("Keep contributing", QMessageBox.ButtonRole.AcceptRole)
        stop = box.addButton("Quit Cotrain", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(keep)
        box.exec()
        clicked = box.clickedButton()
        return "background" if clicked is keep else "quit" if clicked is stop else "cancel"

    def closeEvent(self, event: QCloseEvent) -> None:
        if self.has_tray:
            event.ignore()
            self.hide()
            return
        answer = self.ask_keep_running()
        if answer == "cancel":
            event.ignore()
        elif answer == "background":
            event.ignore()
            self.hide()
        else:
            event.accept()
            self.quit_requested.emit()

    def keyPressEvent(self, event) -> None:
        if event.key() == Qt.Key.Key_Escape and self.has_tray:
            self.hide()
        else:
            super().keyPressEvent(event)
