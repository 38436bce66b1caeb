"""What the app remembers between runs, in QSettings (an INI file in the user's data folder,
so that ``COTRAIN_HOME`` moves it along with everything else). QSettings keeps the values
in memory and writes the file from the event loop, so reads and writes here never wait."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from PySide6.QtCore import QSettings

from engine.governor.limits import Limits, default_limits
from engine.paths import user_data_dir
from engine.worker.protocol import LOCAL_BACKBONE

log = logging.getLogger(__name__)
DEFAULT_PROJECT = "demo-lm"


@dataclass
class Current:
    backbone: str  # LOCAL_BACKBONE or a URL
    project: str


class SettingsStore:
    def __init__(self, settings: QSettings | None = None) -> None:
        self.qsettings = settings or QSettings(str(user_data_dir() / "settings.ini"),
                                               QSettings.Format.IniFormat)

    def _get(self, key: str, default: object = None) -> object:
        return self.qsettings.value(key, default)

    @property
    def first_run(self) -> bool:
        return not self.qsettings.contains("current/backbone")

    def limits(self) -> Limits:
        raw = self._get("limits", "")
        if raw:
            try:
                return Limits.from_json(str(raw))
            except ValueError as exc:
                log.warning("ignoring saved limits: %s", exc)
        return default_limits()

    def set_limits(self, limits: Limits) -> None:
        self.qsettings.setValue("limits", limits.to_json())

    def current(self) -> Current | None:
        """The project to contribute to, or None when the user left every project."""
        backbone = str(self._get("current/backbone", LOCAL_BACKBONE))
        project = str(self._get("current/project", DEFAULT_PROJECT))
        return Current(backbone, project) if backbone and project else None

    def set_current(self, current: Current | None) -> None:
        self.qsettings.setValue("current/backbone", current.backbone if current else "")
        self.qsettings.setValue("current/project", current.project if current else "")

    def backbones(self) -> list[str]:
        """Backbones the user added by URL (the local one is always there)."""
        raw = self._get("backbones", "[]")
        try:
            urls = json.loads(str(raw))
        except ValueError:
            return []
        return [u for u in urls if isinstance(u, str)] if isinstance(urls, list) else []

    def add_backbone(self, url: str) -> None:
        urls = self.backbones()
        if url not in urls:
            self.qsettings.setValue("backbones", json.dumps([*urls, url]))

    def remove_backbone(self, url: str) -> None:
        self.qsettings.setValue("backbones", json.dumps([u for u in self.backbones() if u != url]))

    def rates(self) -> dict[tuple[str, str], float]:
        """This computer's samples/s per (backbone URL, project), as last measured in each
        (a row that is not one, in a hand-edited file, is passed over)."""
        try:
            rows = json.loads(str(self._get("rates", "[]")))
        except ValueError:
            return {}
        rates = {}
        for row in rows if isinstance(rows, list) else ():
            if isinstance(row, list) and len(row) == 3 and _is_rate(row[2]):
                rates[(str(row[0]), str(row[1]))] = float(row[2])
        return rates

    def keep_rate(self, backbone: str, project: str, rate: float) -> None:
        """Remember ``rate`` unless it is within 5% of the one kept (stats come every second)."""
        if not _is_rate(rate):
            return
        rates = self.rates()
        kept = rates.get((backbone, project))
        if kept is not None and abs(rate - kept) <= 0.05 * kept:
            return
        rates[(backbone, project)] = float(rate)
        rows = [[url, pid, r] for (url, pid), r in sorted(rates.items())]
        self.qsettings.setValue("rates", json.dumps(rows))

    @property
    def paused(self) -> bool:
        """The user paused and has not resumed: stays paused across restarts."""
        return str(self._get("paused", "false")).lower() == "true"

    @paused.setter
    def paused(self, value: bool) -> None:
        self.qsettings.setValue("paused", "true" if value else "false")

    @property
    def start_at_login(self) -> bool:
        return str(self._get("start_at_login", "false")).lower() == "true"

    @start_at_login.setter
    def start_at_login(self, value: bool) -> None:
        self.qsettings.setValue("start_at_login", "true" if value else "false")

    @property
    def local_url(self) -> str:
        """Where the local backbone listened last (logins are kept per URL)."""
        return str(self._get("local_url", ""))

    @local_url.setter
    def local_url(self, url: str) -> None:
        self.qsettings.setValue("local_url", url)


def _is_rate(value: object) -> bool:
    """A positive, finite number of samples a second (not NaN, infinity or a boolean)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < 1e12
