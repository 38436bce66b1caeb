"""Whether the computer runs on battery. Tests inject ``sensors_battery``: the same
callable, returning the same shape, that psutil provides."""

from __future__ import annotations

from collections.abc import Callable

import psutil


class PowerSource:
    def __init__(self, sensors_battery: Callable[[], object] | None = None) -> None:
        self._sensors_battery = sensors_battery or psutil.sensors_battery

    def on_battery(self) -> bool | None:
        """True on battery, False on mains (or with no battery at all), None if unknown."""
        try:
            battery = self._sensors_battery()
        except (OSError, RuntimeError, NotImplementedError):
            return None
        if battery is None:
            return False
        plugged = getattr(battery, "power_plugged", None)
        return None if plugged is None else not plugged
