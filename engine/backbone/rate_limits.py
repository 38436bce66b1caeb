"""Rate limits, on the sender: what one peer or one address may ask of the backbone.

Token buckets per key (pure, with a clock, tested without a network). A peer that sends
faster than its bucket allows has the excess dropped (it is slowed); one that keeps at it
is disconnected and its id refused for a while, doubling with each repeat; an address
whose peers keep being thrown out is refused new peers too. Nothing here ever touches the
peer a flood is aimed at.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from engine.ratelimit import Buckets, Rate, Sweeps
from engine.wire.control import (
    AuditDone,
    Availability,
    BadState,
    Evaluated,
    PeerMessage,
    Ping,
    Progress,
    Ready,
    RoundDone,
    Signal,
    SyncRequest,
)

log = logging.getLogger(__name__)


class Kind(Enum):
    """What a peer's message asks of the backbone, each with its own bucket."""

    SIGNAL = "signal"  # relayed to another peer
    SYNC = "sync"  # a SyncRequest: the tracker looks for a donor
    REPORT = "report"  # progress, availability, pings, held-out scores
    OUTCOME = "outcome"  # ready, round done, audit done, bad state


def kind_of(msg: PeerMessage) -> Kind:
    if isinstance(msg, Signal):
        return Kind.SIGNAL
    if isinstance(msg, SyncRequest):
        return Kind.SYNC
    if isinstance(msg, (Progress, Availability, Ping, Evaluated)):
        return Kind.REPORT
    assert isinstance(msg, (Ready, RoundDone, AuditDone, BadState))
    return Kind.OUTCOME


@dataclass(frozen=True)
class LimitsConfig:
    """Ten times what an honest peer sends at the fastest: an outcome per round and a few
    reports (one per micro-batch that may reach the target; before its first step one per
    50 ms), and a small project's rounds come ten a second; a signal or two per new link;
    a state request per join or resync. An honest message must never be dropped: one lost
    outcome holds a round to its deadline."""

    per_peer: dict[Kind, Rate] = field(default_factory=lambda: {
        Kind.SIGNAL: Rate(50.0, 500.0),
        Kind.SYNC: Rate(2.0, 20.0),
        Kind.REPORT: Rate(150.0, 1500.0),
        Kind.OUTCOME: Rate(100.0, 1000.0),
    })
    # "Address" is an address group here (addresses.py): an IPv4 address, an IPv6 /64.
    joins_per_address: Rate = Rate(0.2, 30.0)
    registrations_per_address: Rate = Rate(1 / 600, 5.0)
    # Link probes (api_probe.py): an honest peer probes each way at join and every half hour.
    probes_per_peer: Rate = Rate(1 / 60, 4.0)
    # A peer downloads the checkpoint when it joins or resyncs; a NAT may hide a lab of them.
    checkpoint_downloads_per_peer: Rate = Rate(1 / 60, 3.0)
    checkpoint_downloads_per_address: Rate = Rate(0.1, 16.0)
    # Log-ins (logins.py); tokens last 90 days, so an honest user logs in rarely.
    failed_logins_per_account: int = 5  # a minute, from one address
    logins_per_account: int = 10  # successful, a minute
    logins_per_address: Rate = Rate(0.5, 10.0)  # right or wrong, across accounts: 30 a minute
    password_hashes_at_once: int = 2  # 128 MiB each while they run
    peers_per_address: int = 64  # connected at once
    connections_per_address: int = 128  # TCP, at once: 64 peers' sockets and their HTTP
    drops_before_disconnect: int = 200  # within a minute
    refuse_for: float = 60.0  # first time; doubles with each repeat, up to an hour
    max_refusal: float = 3600.0
    bans_before_address_refused: int = 3


DROP_WINDOW = 60.0  # seconds over which dropped messages add up to a disconnect
BAN_MEMORY = 600.0  # seconds an address's thrown-out peers count against it


class Refusals:
    """Keys (peer ids, addresses) refused until a time that doubles with each repeat; a key
    refused nothing for as long as the longest refusal is forgiven its repeats."""

    def __init__(self, first: float, longest: float, clock: Callable[[], float]) -> None:
        self.first = first
        self.longest = longest
        self._clock = clock
        self._refused: dict[str, tuple[float, int]] = {}  # key -> (until, times)
        self._sweeps = Sweeps()

    def refuse(self, key: str) -> float:
        now = self._clock()
        until, times = self._refused.get(key, (now, 0))
        if now - until > self.longest:
            times = 0
        pause = min(self.first * 2**times, self.longest)
        self._refused[key] = (now + pause, times + 1)
        if self._sweeps.due(len(self._refused)):
            self._refused = {k: v for k, v in self._refused.items() if now - v[0] <= self.longest}
            self._sweeps.swept(len(self._refused))
        return pause

    def retry_after(self, key: str) -> float:
        until, _ = self._refused.get(key, (0.0, 0))
        return max(until - self._clock(), 0.0)


class Throttle:
    """The backbone's limits on peers and addresses."""

    def __init__(self, config: LimitsConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config or LimitsConfig()
        self._clock = clock
        self._messages = {kind: Buckets(rate, clock) for kind, rate in self.config.per_peer.items()}
        self.joins = Buckets(self.config.joins_per_address, clock)
        self.registrations = Buckets(self.config.registrations_per_address, clock)
        self.probes = Buckets(self.config.probes_per_peer, clock)
        self._downloads_by_peer = Buckets(self.config.checkpoint_downloads_per_peer, clock)
        self._downloads_by_address = Buckets(self.config.checkpoint_downloads_per_address, clock)
        self.refused = Refusals(self.config.refuse_for, self.config.max_refusal, clock)
        self._drops: dict[str, tuple[float, int]] = {}  # peer -> (since, messages dropped since)
        self._bans: dict[str, list[float]] = {}  # address -> when its peers were thrown out
        self._ban_sweeps = Sweeps()

    def checkpoint_download(self, peer_id: str, address: str) -> float:
        """0 if ``peer_id`` (from ``address``) may download a checkpoint now, and it is
        counted; else the seconds to wait."""
        wait = max(self._downloads_by_peer.wait(peer_id), self._downloads_by_address.wait(address))
        if wait == 0:
            self._downloads_by_peer.take(peer_id)
            self._downloads_by_address.take(address)
        return wait

    def allow(self, peer_id: str, msg: PeerMessage) -> bool:
        """Whether to act on ``msg``; False drops it (the sender is slowed)."""
        if self._messages[kind_of(msg)].take(peer_id):
            return True
        now = self._clock()
        since, dropped = self._drops.get(peer_id, (now, 0))
        if now - since > DROP_WINDOW:  # a burst long ago does not count toward this one
            since, dropped = now, 0
        self._drops[peer_id] = (since, dropped + 1)
        return False

    def should_disconnect(self, peer_id: str) -> bool:
        return self._drops.get(peer_id, (0.0, 0))[1] >= self.config.drops_before_disconnect

    def disconnected(self, peer_id: str, address: str) -> float:
        """``peer_id`` was thrown out for flooding: refuse it (and, if its address keeps
        sending such peers, the address) for a while; returns for how long."""
        self._drops.pop(peer_id, None)
        pause = self.refused.refuse(peer_id)
        now = self._clock()
        recent = [t for t in self._bans.get(address, []) if now - t < BAN_MEMORY] + [now]
        self._bans[address] = recent
        if self._ban_sweeps.due(len(self._bans)):
            self._bans = {a: ts for a, ts in self._bans.items() if now - ts[-1] < BAN_MEMORY}
            self._ban_sweeps.swept(len(self._bans))
        if len(recent) >= self.config.bans_before_address_refused:
            log.warning("refusing new peers from %s for %.0f s: %d of its peers flooded", address,
                        self.refused.refuse(address), len(recent))
        return pause

    def forget(self, peer_id: str) -> None:
        """A peer that left: its counters go (its refusal, if any, stays)."""
        self._drops.pop(peer_id, None)
