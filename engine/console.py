"""Human-readable progress for the terminal: one rewritten line on a TTY, plain lines otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StatusLine:
    def __init__(self, stream: TextIO = sys.stderr, min_interval: float = 5.0) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.min_interval = min_interval
        self._last = ""
        self._last_time = 0.0

    def update(self, text: str) -> None:
        """Show ``text`` as the current status (throttled when not on a terminal)."""
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
        elif text != self._last and time.monotonic() - self._last_time >= self.min_interval:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_time = time.monotonic()
        self._last = text

    def say(self, text: str) -> None:
        """Print a permanent line above the status."""
        if self.tty:
            self.stream.write("\r\033[K" + text + "\n" + self._last)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def bar(fraction: float, width: int = 20) -> str:
    filled = round(max(0.0, min(fraction, 1.0)) * width)
    return "[" + "#" * filled + "." * (width - filled) + "]"


def megabytes(n: int) -> str:
    return f"{n / 1e6:.1f} MB"
