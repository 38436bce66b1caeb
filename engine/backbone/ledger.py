"""Who gets credit for a completed step, and how much: pure rules, tested alone.

Credit is what others saw a member compute: each reducer reports the samples every sender's
part carried, and a sender is credited with the count that reducers holding a strict
majority of the vector reported (at least) -- a minority of lying reducers can neither
raise nor lower it; what a sender says of itself counts for nothing. And never more than
its measured throughput makes plausible. Two bounds, the larger wins so that an honest peer
is never cut:

- its trajectory: what it had reported (members report on taking their accumulator for
  the round), plus one micro-batch (the one under way), plus
  what its rate allows between its last report and the round's first success (by then
  every member had stopped accumulating, or that success could not have had its parts);
- its best throughput (samples per second of compute, the best it ever reported) times
  the wall-clock time it had been accumulating: compute time never exceeds wall time.

With ``TOLERANCE`` to spare for jitter in the first, and ``SPEED_UP`` in the second: a
peer's throughput may jump when a neighbour process stops. A peer that claims ten times
what it computed is credited a small multiple of what it computed.

An auxiliary peer computes no samples: it is credited with the bytes it aggregated -- the
wire size of the parts it reduced, once per sender whose part the majority of reducers
saw -- in rounds that settled with its results applied.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from engine.planning.sizes import encoded_size
from engine.project import CompressionMethod

log = logging.getLogger(__name__)

TOLERANCE = 1.5
SPEED_UP = 2.0


@dataclass
class Claim:
    """What the tracker had measured of a member when its round opened."""

    reported: int  # samples in its last progress report
    rate: float  # its pace, samples/s, timed by the backbone
    micro_batch: int  # samples per micro-batch: the one under way joins the round
    unreported_seconds: float  # from its last report to the round's first success
    compute_seconds: float
    accumulating_seconds: float
    best_throughput: float = 0.0  # samples per second of compute, the best it reported

    def plausible_samples(self) -> int:
        trajectory = self.reported + self.micro_batch + self.rate * self.unreported_seconds
        by_time = self.best_throughput * self.accumulating_seconds + self.micro_batch
        return math.ceil(max(TOLERANCE * trajectory, SPEED_UP * by_time))


@dataclass
class Credit:
    samples: int
    compute_seconds: float
    aggregated_bytes: int = 0  # an auxiliary peer's: what it reduced for the others


def bytes_aggregated(part_sizes: Sequence[int], senders: int, method: CompressionMethod) -> int:
    """What a reducer of parts of ``part_sizes`` elements took in from ``senders`` senders."""
    return senders * sum(encoded_size(n, method) for n in part_sizes)


def credits(seen: dict[str, int], claims: dict[str, Claim]) -> dict[str, Credit]:
    """Credit per member of a completed round."""
    out = {}
    for peer, claim in claims.items():
        samples = min(seen.get(peer, 0), claim.plausible_samples())
        if samples < seen.get(peer, 0):
            log.warning("crediting %s with %d of the %d samples it claimed: %s",
                        peer, samples, seen[peer], claim)
        if samples > 0:
            seconds = min(claim.compute_seconds, claim.accumulating_seconds)
            out[peer] = Credit(samples, round(max(seconds, 0.0), 3))
    return out
