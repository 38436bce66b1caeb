"""Punishment belongs to the identity, not to the socket: a peer that reconnects -- with the
same peer id, from another id of the same account, or from the same address group -- finds
the strikes, exclusion, probation and demotion it left with.

Keys are what a stranger cannot shed at will: its peer id (reconnecting with the same id
and token), its account, and, for an expulsion only (harm done on purpose), its address
group (an IPv4 address, an IPv6 /64: engine/backbone/addresses.py). Strikes and demotions
do not follow an address: many honest users may share one NAT's. Standings expire once
nothing in them holds any longer and they are an hour old, and the table is swept
whenever it doubles, so identities that come and go cannot grow it without end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.ratelimit import Sweeps

if TYPE_CHECKING:
    from engine.backbone.tracker.membership import PeerState

FORGET_AFTER = 3600.0  # a standing nothing holds any more is forgotten this long after it was kept


@dataclass
class Standing:
    """What an identity left with: its strikes, exclusions, demotions and probation."""

    strikes: int = 0
    excluded_until: float = 0.0
    sends_only_until: float = 0.0
    unshown: int = 0
    proven: bool = False
    checks_nothing_until: float = 0.0
    lapsed: int = 0
    kept_at: float = 0.0


@dataclass
class Identity:
    """The keys a peer is known by besides its id."""

    account: int | None = None
    address_group: str | None = None

    def keys(self, peer_id: str) -> list[str]:
        keys = [f"peer:{peer_id}"]
        if self.account is not None:
            keys.append(f"user:{self.account}")
        return keys

    def expulsion_keys(self, peer_id: str) -> list[str]:
        keys = self.keys(peer_id)
        if self.address_group is not None:
            keys.append(f"address:{self.address_group}")
        return keys


@dataclass
class Standings:
    """Each identity's standing while its peers come and go."""

    clock: Callable[[], float]
    identities: dict[str, Identity] = field(default_factory=dict)  # of the peers here now
    _kept: dict[str, Standing] = field(default_factory=dict)
    _sweeps: Sweeps = field(default_factory=Sweeps)

    def arrived(self, peer: PeerState, identity: Identity) -> None:
        """A peer joins (or reconnects): it takes up what its identities left with."""
        self.identities[peer.peer_id] = identity
        now = self.clock()
        for key in identity.expulsion_keys(peer.peer_id):
            standing = self._kept.get(key)
            if standing is None:
                continue
            peer.excluded_until = max(peer.excluded_until, standing.excluded_until)
            if key.startswith("address:"):
                continue
            peer.strikes = max(peer.strikes, standing.strikes)
            peer.sends_only_until = max(peer.sends_only_until, standing.sends_only_until)
            peer.unshown = max(peer.unshown, standing.unshown)
            peer.checks_nothing_until = max(peer.checks_nothing_until, standing.checks_nothing_until)
            peer.lapsed = max(peer.lapsed, standing.lapsed)
            if key.startswith("peer:") and peer.strikes == 0 and peer.excluded_until <= now:
                peer.proven = standing.proven

    def left(self, peer: PeerState) -> None:
        """A peer's socket closed: what it is judged by stays with its identities."""
        identity = self.identities.pop(peer.peer_id, Identity())
        for key in identity.keys(peer.peer_id):
            self._keep(key, Standing(peer.strikes, peer.excluded_until, peer.sends_only_until, peer.unshown,
                                   peer.proven and key.startswith("peer:"), peer.checks_nothing_until,
                                   peer.lapsed))

    def expelled(self, peer: PeerState) -> None:
        """It was caught doing harm on purpose: every identity of it is kept out as long."""
        identity = self.identities.get(peer.peer_id, Identity())
        for key in identity.expulsion_keys(peer.peer_id):
            standing = self._kept.get(key, Standing())
            standing.excluded_until = max(standing.excluded_until, peer.excluded_until)
            if not key.startswith("address:"):
                standing.strikes = max(standing.strikes, peer.strikes)
            self._keep(key, standing)

    def _keep(self, key: str, standing: Standing) -> None:
        now = self.clock()
        standing.kept_at = now
        self._kept[key] = standing
        if self._sweeps.due(len(self._kept)):
            self._kept = {k: r for k, r in self._kept.items() if not _expired(r, now)}
            self._sweeps.swept(len(self._kept))


def _expired(standing: Standing, now: float) -> bool:
    return (now - standing.kept_at > FORGET_AFTER and standing.excluded_until <= now
            and standing.sends_only_until <= now and standing.checks_nothing_until <= now)
