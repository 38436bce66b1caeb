"""Who gets credit for a completed step, and how much: pure rules, tested alone.

A member is credited with the samples every reducer confirmed receiving from it, but never
more than its own pace makes plausible: what it had reported, plus one report's worth, plus
what its measured rate allows between its last report and the round's opening — with
``TOLERANCE`` to spare for honest jitter. A peer that claims ten times what it computed
is credited about what it computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TOLERANCE = 1.5


@dataclass
class Claim:
    """What the tracker had measured of a member when its round opened."""

    reported: int  # samples in its last progress report
    rate: float  # reported samples / seconds it had been accumulating, timed by the backbone
    largest_report_step: int  # biggest jump between two of its reports: about a micro-batch
    unreported_seconds: float  # from its last report to the round's opening
    compute_seconds: float
    accumulating_seconds: float

    def plausible_samples(self) -> int:
        expected = self.reported + self.largest_report_step + self.rate * self.unreported_seconds
        return math.ceil(TOLERANCE * expected)


@dataclass
class Credit:
    samples: int
    compute_seconds: float


def credits(confirmed: dict[str, int], claims: dict[str, Claim]) -> dict[str, Credit]:
    """Credit per member of a completed round."""
    out = {}
    for peer, claim in claims.items():
        samples = min(confirmed.get(peer, 0), claim.plausible_samples())
        if samples > 0:
            seconds = min(claim.compute_seconds, claim.accumulating_seconds)
            out[peer] = Credit(samples, round(max(seconds, 0.0), 3))
    return out
