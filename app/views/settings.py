"""Settings: every governor limit (engine/governor/limits.py), explained for people who are
not engineers, and start at login. Changes are saved and sent to the running worker at once
(after a short pause, so typing a number is one change); the worker's next state event
confirms them."""

from __future__ import annotations

import os

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QDoubleSpinBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.controller import AppState, Controller
from app.views.common import heading, help_text, message, show_message
from engine.governor.limits import Limits
from engine.worker import protocol as p

APPLY_DELAY_MS = 400


class OptionalNumber(QWidget):
    """A checkbox that enables a number: unchecked means 'no limit'."""

    def __init__(self, label: str, low: int, high: int, suffix: str, default: int) -> None:
        super().__init__()
        self.check = QCheckBox(label)
        self.spin = QSpinBox()
        self.spin.setRange(low, high)
        self.spin.setSuffix(suffix)
        self.spin.setValue(default)
        self.spin.setEnabled(False)
        self.check.toggled.connect(self.spin.setEnabled)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.check)
        layout.addWidget(self.spin)
        layout.addStretch(1)

    def value(self) -> int | None:
        return self.spin.value() if self.check.isChecked() else None

    def set_value(self, value: int | None) -> None:
        self.check.setChecked(value is not None)
        if value is not None:
            self.spin.setValue(value)


class SettingsPage(QWidget):
    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        cores = os.cpu_count() or 1
        self.threads = QSpinBox()
        self.threads.setRange(0, max(cores, 1))
        self.threads.setSpecialValueText("All cores")
        self.cpu_percent = QSpinBox()
        self.cpu_percent.setRange(1, 100)
        self.cpu_percent.setSuffix(" %")
        self.max_memory = OptionalNumber("Limit to", 64, 1 << 20, " MB", 2048)
        self.max_disk = QDoubleSpinBox()
        self.max_disk.setRange(0.1, 10**6)
        self.max_disk.setDecimals(1)
        self.max_disk.setSuffix(" GB")
        self.max_upload = OptionalNumber("Limit to", 1, 10**7, " kB/s", 1000)
        self.max_download = OptionalNumber("Limit to", 1, 10**7, " kB/s", 5000)
        self.use_gpu = QCheckBox("Use the graphics card when possible")
        self.run_on_battery = QCheckBox("Keep contributing while on battery")
        self.only_when_idle = QCheckBox("Contribute only while I am away")
        self.idle_minutes = QDoubleSpinBox()
        self.idle_minutes.setRange(0, 24 * 60)
        self.idle_minutes.setDecimals(1)
        self.idle_minutes.setSuffix(" minutes without keyboard or mouse")
        self.schedule = QLineEdit()
        self.schedule.setPlaceholderText("always")
        self.low_priority = QCheckBox("Let every other program go first")
        self.start_at_login = QCheckBox("Start Cotrain when I log in")
        self.error = message("error")
        self.applied = message("ok")

        self.device = help_text("")
        self._lay_out(self._explained())

        self._timer = QTimer(self, singleShot=True, interval=APPLY_DELAY_MS)
        self._timer.timeout.connect(self.apply)
        self._pending: Limits | None = None
        self.load(controller.store.limits())
        self.start_at_login.setChecked(controller.store.start_at_login)
        for spin in (self.threads, self.cpu_percent, self.max_memory.spin, self.max_disk,
                     self.max_upload.spin, self.max_download.spin, self.idle_minutes):
            spin.valueChanged.connect(self._changed)
        for check in (self.max_memory.check, self.max_upload.check, self.max_download.check, self.use_gpu,
                      self.run_on_battery, self.only_when_idle, self.low_priority):
            check.toggled.connect(self._changed)
        self.schedule.textChanged.connect(self._changed)
        self.start_at_login.toggled.connect(controller.set_start_at_login)
        controller.state_changed.connect(self._state)
        controller.stats.connect(self._stats)
        if controller.last_stats is not None:
            self._stats(controller.last_stats)

    def _explained(self) -> list[tuple[str, QWidget, str]]:
        """Each setting's title, control and explanation, in the order they show."""
        return [
            ("Processor cores", self.threads,
             "How many processor cores Cotrain may use at once. Fewer cores leave more room for "
             "your own programs; \"All cores\" trains fastest."),
            ("Working time", self.cpu_percent,
             "Cotrain works this share of the time and rests the remainder, which keeps the computer "
             "cooler and quieter. 100 % means no rests."),
            ("Memory", self.max_memory,
             "Pause whenever Cotrain itself uses more memory than this, and continue once it uses less."),
            ("Disk space", self.max_disk,
             "Projects' data (their shards) kept on this computer. Past this, what was used least "
             "recently is deleted; a project whose single file is larger cannot be joined."),
            ("Upload speed", self.max_upload,
             "How fast Cotrain may send data to other volunteers, so your own internet stays quick. "
             "1000 kB/s is about 8 Mbit/s."),
            ("Download speed", self.max_download,
             "How fast other volunteers may send data to you."),
            ("Graphics card", self.use_gpu,
             "With an NVIDIA graphics card (CUDA), Cotrain computes on it: much faster, and every "
             "volunteer's results stay identical. Untick to keep the graphics card for yourself."),
            ("Battery", self.run_on_battery,
             "When unticked, Cotrain pauses while a laptop runs on battery and continues once it has been "
             "plugged in for a little while."),
            ("When I am away", self.only_when_idle,
             "Work only after you have left keyboard and mouse alone for a while, and stop within a second "
             "when you come back."),
            ("Away means", self.idle_minutes, "How long without input counts as being away."),
            ("Hours", self.schedule,
             "When Cotrain may work, for example \"mon-fri 18:00-08:00, weekends\" (evenings, nights and "
             "weekends). Leave it empty or write \"always\" for any time."),
            ("Priority", self.low_priority,
             "Cotrain runs at the lowest priority, so anything you start gets the processor first. "
             "Turning this off takes effect the next time Cotrain starts: a program may lower its own "
             "priority, but only the system raises it again."),
            ("Start at login", self.start_at_login,
             "Open Cotrain quietly in the tray when you log in to this computer."),
        ]

    def _lay_out(self, rows: list[tuple[str, QWidget, str]]) -> None:
        """Each setting is a title, its control and its explanation, one under the other: a
        form's second column clipped wrapped explanations, and a mistake's message sits
        right under the control it is about."""
        inner = QWidget()
        layout = QVBoxLayout(inner)
        layout.addWidget(heading("Settings"))
        layout.addWidget(help_text("Changes apply at once, without restarting Cotrain (but for raising "
                                   "its priority again, below)."))
        layout.addWidget(self.applied)
        for label, widget, text in rows:
            box = QVBoxLayout()
            box.setSpacing(2)
            box.addWidget(QLabel(f"<b>{label}</b>"))
            box.addWidget(widget)
            if widget is self.schedule:
                box.addWidget(self.error)
            box.addWidget(help_text(text))
            if widget is self.use_gpu:
                box.addWidget(self.device)
            layout.addLayout(box)
            layout.addSpacing(8)
        layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(inner)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)

    def load(self, limits: Limits) -> None:
        widgets = (self.threads, self.cpu_percent, self.max_memory.check, self.max_memory.spin, self.max_disk,
                   self.max_upload.check, self.max_upload.spin, self.max_download.check,
                   self.max_download.spin, self.use_gpu, self.run_on_battery, self.only_when_idle,
                   self.idle_minutes, self.schedule, self.low_priority)
        for widget in widgets:
            widget.blockSignals(True)
        self.threads.setValue(limits.threads or 0)
        self.cpu_percent.setValue(limits.cpu_percent)
        self.max_memory.set_value(limits.max_memory_mb)
        self.max_disk.setValue(limits.max_disk_gb)
        self.max_upload.set_value(limits.max_upload_kbps)
        self.max_download.set_value(limits.max_download_kbps)
        self.use_gpu.setChecked(limits.use_gpu)
        self.run_on_battery.setChecked(limits.run_on_battery)
        self.only_when_idle.setChecked(limits.only_when_idle)
        self.idle_minutes.setValue(limits.idle_minutes)
        self.idle_minutes.setEnabled(limits.only_when_idle)
        self.schedule.setText("" if limits.schedule == "always" else limits.schedule)
        self.low_priority.setChecked(limits.low_priority)
        for widget in widgets:
            widget.blockSignals(False)

    def limits(self) -> Limits:
        """The limits the form shows; raises ValueError naming what is wrong."""
        return Limits.checked(
            threads=self.threads.value() or None, cpu_percent=self.cpu_percent.value(),
            max_memory_mb=self.max_memory.value(), max_disk_gb=self.max_disk.value(),
            max_upload_kbps=self.max_upload.value(),
            max_download_kbps=self.max_download.value(), use_gpu=self.use_gpu.isChecked(),
            run_on_battery=self.run_on_battery.isChecked(), only_when_idle=self.only_when_idle.isChecked(),
            idle_minutes=self.idle_minutes.value(), schedule=self.schedule.text().strip() or "always",
            low_priority=self.low_priority.isChecked(),
        )

    def _changed(self) -> None:
        self.idle_minutes.setEnabled(self.only_when_idle.isChecked())
        show_message(self.applied, "")
        self._timer.start()

    def apply(self) -> None:
        self._timer.stop()
        try:
            limits = self.limits()
        except ValueError as exc:
            show_message(self.error, f"Not applied: {exc}")
            return
        show_message(self.error, "")
        self._pending = limits
        self.controller.set_limits(limits)

    def _stats(self, stats: p.Stats) -> None:
        if stats.device:
            self.device.setText(f"Right now Cotrain computes on {stats.device}.")

    def _state(self, state: AppState) -> None:
        if self._pending is not None and state.limits == self._pending:
            self._pending = None
            show_message(self.applied, "Applied to the running worker.")
        elif self._pending is None and not self._timer.isActive() and state.limits != self._shown():
            self.load(state.limits)  # changed elsewhere, e.g. the tray's "only while idle"

    def _shown(self) -> Limits | None:
        try:
            return self.limits()
        except ValueError:
            return None
