"""The first run's one screen (BOINC's first run is a short wizard): what Cotrain will do,
on which project, and within which limits -- a share of the processor cores, at any time or
only while the owner is away. Nothing trains before Start; the choices made here are the
Settings page's."""

from __future__ import annotations

import os

from PySide6.QtWidgets import (
    QButtonGroup,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QRadioButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.controller import Controller
from app.views.common import heading, help_text
from engine.governor.limits import default_limits


class WelcomePage(QWidget):
    def __init__(self, controller: Controller, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller = controller
        cores = os.cpu_count() or 1
        limits = default_limits()
        self.cores = QSpinBox()
        self.cores.setRange(1, cores)
        self.cores.setValue(limits.threads or cores)
        self.cores.setSuffix(f" of {cores}")
        self.always = QRadioButton("At any time, at the lowest priority: your own programs always go first")
        self.away = QRadioButton("Only while I am away from the keyboard and mouse (5 minutes)")
        self.always.setChecked(True)
        when = QButtonGroup(self)
        when.addButton(self.always)
        when.addButton(self.away)
        self.start_button = QPushButton("Start contributing")
        self.start_button.setDefault(True)
        self.start_button.clicked.connect(self.start)

        cores_row = QHBoxLayout()
        cores_row.addWidget(QLabel("Processor cores Cotrain may use:"))
        cores_row.addWidget(self.cores)
        cores_row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(40, 30, 40, 30)
        layout.addWidget(heading("Welcome to Cotrain"))
        layout.addWidget(help_text(
            "Cotrain lends this computer's spare time to train a deep-learning model together with other "
            "volunteers: each computer works on its own examples, and together they take the same steps "
            "one big computer would. It works within the limits you set here, and you can pause it from "
            "the tray icon at any time."))
        layout.addSpacing(12)
        layout.addWidget(QLabel("<b>The project</b>"))
        layout.addWidget(help_text(
            "The demo language model, hosted on this computer: a small model learning to write Python. "
            "Projects on other computers are under Projects, once you have started."))
        layout.addSpacing(12)
        layout.addWidget(QLabel("<b>How much of this computer</b>"))
        layout.addLayout(cores_row)
        layout.addWidget(self.always)
        layout.addWidget(self.away)
        layout.addWidget(help_text("Everything here, and more (memory, internet speed, battery, hours), can "
                                   "be changed later under Settings."))
        layout.addSpacing(16)
        buttons = QHBoxLayout()
        buttons.addStretch(1)
        buttons.addWidget(self.start_button)
        layout.addLayout(buttons)
        layout.addStretch(1)

    def start(self) -> None:
        limits = default_limits()
        limits.threads = self.cores.value()
        limits.only_when_idle = self.away.isChecked()
        self.controller.begin(limits)
