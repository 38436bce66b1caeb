"""When a round opens, and with whom: the live peers' samples reach the target batch, no
joiner is still downloading the state, and the group can all reach each other."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.backbone.tracker.membership import Members, Pace, PeerState
from engine.backbone.tracker.pairs import Pairs
from engine.project import ProjectSpec
from engine.wire.control import RoundDone, RoundStart

log = logging.getLogger(__name__)


@dataclass
class OpenRound:
    round_id: int
    epoch: int
    group: list[str]
    shares: list[float]
    opened_at: float
    deadline: float
    checkpoint_by: str | None
    members: dict[str, Pace]  # what each member had reported, refreshed during the round
    outcomes: dict[str, RoundDone] = field(default_factory=dict)
    advanced_to: str | None = None  # params hash of the first success

    def settled(self, alive: set[str]) -> bool:
        return all(p in self.outcomes or p not in alive for p in self.group)

    def start(self, timeout: float) -> RoundStart:
        return RoundStart(self.round_id, self.epoch, self.group, self.shares, timeout, self.checkpoint_by)


class Scheduler:
    def __init__(self, project: ProjectSpec, members: Members, pairs: Pairs, clock: Callable[[], float], *,
                 retry_delay: float, join_grace: float, last_round_id: int) -> None:
        self.project = project
        self.members = members
        self.pairs = pairs
        self.retry_delay = retry_delay
        self.join_grace = join_grace
        self._clock = clock
        self._retry_at = 0.0
        self._round_ids = itertools.count(last_round_id + 1)

    def retry_later(self) -> None:
        """A round failed: give the peers a moment before the next."""
        self._retry_at = self._clock() + self.retry_delay

    def may_download(self, peer: PeerState, now: float) -> bool:
        """Whether a syncing peer's download is worth holding rounds for: not from a donor
        it is kept apart from, or whose last exchange with it failed."""
        donor = peer.donor
        return donor is None or (self.pairs.reachable(peer.peer_id, donor, now)
                                 and not self.pairs.failed_lately(peer.peer_id, donor))

    def open(self, epoch: int, last_checkpoint: int) -> OpenRound | None:
        """A round for ``epoch`` if one is due now (the caller knows none is open)."""
        now = self._clock()
        target = self.project.target_batch_size
        if now < self._retry_at:
            return None
        live = self.members.live(epoch)
        if not live or sum(p.samples for p in live) < target:
            return None
        # A download still under way after a round's timeout holds the others no longer: its
        # donor may sit behind a link that died unnoticed (a NAT that rebound), and a
        # failed round would not have cost them more.
        hold = min(self.join_grace, self.project.round_timeout)
        if any(p.syncing_since is not None and now - p.syncing_since < hold and self.may_download(p, now)
               for p in self.members.peers.values()):
            # A joiner is downloading the current state. Opening the round now would make
            # that state stale on arrival; everyone keeps accumulating meanwhile, so
            # waiting costs a slightly larger batch, not wasted work.
            return None
        group = self.pairs.connected_group([(p.peer_id, p.samples) for p in live], now)
        members = [p for p in live if p.peer_id in group]
        if sum(p.samples for p in members) < target:
            return None
        due = epoch + 1 - last_checkpoint >= self.project.checkpoint_every
        rnd = OpenRound(
            round_id=next(self._round_ids), epoch=epoch, group=group, shares=shares(members, group),
            opened_at=now, deadline=now + self.project.round_timeout,
            checkpoint_by=group[0] if due else None,
            members={p.peer_id: Pace.of(p, members) for p in members},
        )
        log.info("%s: round %d for epoch %d with %d peers, %d samples", self.project.id,
                 rnd.round_id, rnd.epoch, len(group), sum(m.samples for m in rnd.members.values()))
        return rnd


def shares(members: list[PeerState], group: list[str]) -> list[float]:
    """Equal parts, except that client-mode peers reduce nothing (unless all are)."""
    client = {p.peer_id for p in members if p.client_mode}
    if len(client) == len(group):
        return [1.0] * len(group)
    return [0.0 if peer in client else 1.0 for peer in group]
