"""The tray icon: one icon per state, the state and its reason as tooltip, the menu a
volunteer needs without opening a window, and notifications (joining, errors, milestones).
Modelled on ActivityWatch's aw_qt/trayicon.py."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu, QSystemTrayIcon

from app.controller import AppState, Controller, TrayKind
from app.icons import icon
from engine.problems import short

SNOOZE_SECONDS = 3600


class TrayIcon(QSystemTrayIcon):
    def __init__(self, controller: Controller, open_page: Callable[[str], None]) -> None:
        super().__init__(icon("tray-paused"))
        self.controller = controller
        self.open_page = open_page
        self.kind: TrayKind | None = None
        menu = QMenu()
        self.status_action = menu.addAction("Starting…")
        self.status_action.setEnabled(False)
        menu.addSeparator()
        self.contribute_action = menu.addAction("Contribute now", controller.contribute_now)
        self.pause_action = menu.addAction("Pause", self._pause_or_resume)
        self.snooze_action = menu.addAction("Snooze 1 hour", lambda: controller.snooze(SNOOZE_SECONDS))
        self.idle_action = QAction("Contribute only while idle", menu, checkable=True)
        self.idle_action.toggled.connect(self._idle_toggled)
        menu.addAction(self.idle_action)
        menu.addSeparator()
        menu.addAction("Open Cotrain", lambda: open_page("dashboard"))
        menu.addAction("Projects…", lambda: open_page("projects"))
        menu.addAction("Settings…", lambda: open_page("settings"))
        menu.addSeparator()
        menu.addAction("Quit", controller.quit)
        self.menu = menu
        self.setContextMenu(menu)
        self.activated.connect(self._activated)
        # A notification is drawn right over the icon (its arrow points at the icon's middle):
        # clicking it must do what clicking the icon does, or the click is lost.
        self.messageClicked.connect(lambda: open_page("dashboard"))
        controller.state_changed.connect(self.show_state)
        controller.notice.connect(self.notify)
        self.show_state(controller.state)

    def _activated(self, reason: QSystemTrayIcon.ActivationReason) -> None:
        if reason in (QSystemTrayIcon.ActivationReason.Trigger, QSystemTrayIcon.ActivationReason.DoubleClick):
            self.open_page("dashboard")

    def _pause_or_resume(self) -> None:
        if self.controller.state.user_paused:
            self.controller.resume()
        else:
            self.controller.pause()

    def _idle_toggled(self, checked: bool) -> None:
        if checked != self.controller.state.limits.only_when_idle:
            self.controller.set_only_when_idle(checked)

    def show_state(self, state: AppState) -> None:
        if state.kind != self.kind:
            self.kind = state.kind
            self.setIcon(icon(f"tray-{state.kind}"))
        self.setToolTip(state.tooltip)
        self.status_action.setText(short(state.reason))  # (the whole of it in the tooltip)
        self.pause_action.setText("Resume" if state.user_paused else "Pause")
        self.idle_action.blockSignals(True)
        self.idle_action.setChecked(state.limits.only_when_idle)
        self.idle_action.blockSignals(False)

    def notify(self, title: str, message: str, kind: str) -> None:
        icons = QSystemTrayIcon.MessageIcon
        level = icons.Critical if kind == "error" else icons.Information
        if self.isVisible() and self.supportsMessages():
            self.showMessage(title, message, level, 8000)
