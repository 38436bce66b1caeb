"""Small building blocks the pages share: headings, help text, a number tile, formatting."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QVBoxLayout, QWidget

TRAINING_LOSS, HELD_OUT_LOSS = "#4c6ef5", "#f76707"  # the loss curves' colours, wherever drawn


def heading(text: str) -> QLabel:
    label = QLabel(text)
    font = label.font()
    font.setPointSizeF(font.pointSizeF() * 1.5)
    font.setBold(True)
    label.setFont(font)
    return label


def _muted(label: QLabel) -> None:
    """The text colour, a little transparent: readable on light and dark themes alike."""
    c = label.palette().windowText().color()
    label.setStyleSheet(f"color: rgba({c.red()}, {c.green()}, {c.blue()}, 0.68);")


def help_text(text: str) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    _muted(label)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return label


def message(kind: str = "error") -> QLabel:
    """A label for errors (red) or notes (amber); hidden while empty."""
    label = QLabel()
    label.setWordWrap(True)
    colour = {"error": "#c92a2a", "warning": "#e67700", "ok": "#2b8a3e"}[kind]
    label.setStyleSheet(f"color: {colour};")
    label.setVisible(False)
    return label


def show_message(label: QLabel, text: str) -> None:
    label.setText(text)
    label.setVisible(bool(text))


class Tile(QFrame):
    """A figure with its caption, e.g. '16.2' over 'samples per second'."""

    def __init__(self, caption: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 8, 10, 8)
        self.value = QLabel("–")
        font = self.value.font()
        font.setPointSizeF(font.pointSizeF() * 1.6)
        font.setBold(True)
        self.value.setFont(font)
        self.caption = QLabel(caption)
        _muted(self.caption)
        layout.addWidget(self.value)
        layout.addWidget(self.caption)

    def set(self, text: str) -> None:
        self.value.setText(text)

    def text(self) -> str:
        return self.value.text()


def count(n: int) -> str:
    return f"{n:,}"


def size(nbytes: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def rate(bytes_per_second: float) -> str:
    if bytes_per_second >= 1e6:
        return f"{bytes_per_second / 1e6:.1f} MB/s"
    return f"{bytes_per_second / 1e3:.1f} kB/s"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = max(round(seconds), 0)
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 90 * 60:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
