"""This peer's link as the tracker's load balancing sees it: achievable bytes per second
each way (engine/planning/load_balancing.py divides the vector by them).

A probe against the backbone sets the estimate when the peer joins and again every
``REPROBE_EVERY``, like the speed test DeDLOC's volunteers ran. Rounds then refine it:
a round's bytes over its duration is a lower bound on the link (the round also waited on
other peers), so a round that moved faster raises the estimate (an EMA), and none lowers
it: a peer that waited on a slow partner would otherwise be given less and less to do.
The user's own caps bound what is reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

PROBE_SECONDS = 1.5  # per direction; a probe also stops at PROBE_BYTES
REPROBE_EVERY = 1800.0
RAISE = 0.3  # weight of a round that beat the estimate
# Rounds that moved less than this say more about latency than about the link.
MIN_ROUND_BYTES = 256 * 1024


@dataclass(frozen=True)
class LinkEstimate:
    upload: float | None = None  # bytes per second; None: not measured yet
    download: float | None = None


class Bandwidth:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._upload: float | None = None
        self._download: float | None = None
        self._probed_at = -math.inf

    def probe_due(self) -> bool:
        return self._clock() - self._probed_at >= REPROBE_EVERY

    def probed(self, upload: float, download: float) -> None:
        self._upload, self._download = upload, download
        self._probed_at = self._clock()

    def observed(self, sent: int, received: int, seconds: float) -> None:
        """A round moved ``sent`` and ``received`` bytes in ``seconds``."""
        if seconds <= 0:
            return
        if sent >= MIN_ROUND_BYTES:
            self._upload = _raised(self._upload, sent / seconds)
        if received >= MIN_ROUND_BYTES:
            self._download = _raised(self._download, received / seconds)

    def estimate(self, max_upload: float | None = None, max_download: float | None = None) -> LinkEstimate:
        """The estimate, within the user's caps (bytes per second; None: uncapped)."""
        return LinkEstimate(_capped(self._upload, max_upload), _capped(self._download, max_download))


def _raised(estimate: float | None, seen: float) -> float:
    if estimate is None:
        return seen
    return estimate + RAISE * (seen - estimate) if seen > estimate else estimate


def _capped(value: float | None, cap: float | None) -> float | None:
    if value is None or cap is None:
        return value if value is not None else cap
    return min(value, cap)
