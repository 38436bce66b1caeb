"""Whom a peer that just became ready will average with, so it links to them before its
first round: a link set up through signaling and ICE takes from a tenth of a second on
loopback to seconds across NATs, and a round whose member still dials waits for it."""

from __future__ import annotations

from engine.backbone.tracker.membership import Members, PeerState
from engine.backbone.tracker.pairs import Pairs
from engine.wire.control import MAX_PARTNERS


def partners(members: Members, pairs: Pairs, peer: PeerState, epoch: int, now: float,
             grouped: bool = False) -> list[str]:
    """The live trainers of ``epoch`` and (for a trainer) the auxiliary peers that ``peer``
    may be grouped with and exchange with: not kept apart from it, and not both reducing
    nothing (they send only to reducers). Auxiliary and proven peers first (the reducers
    rounds need), at most MAX_PARTNERS: a round with more links to the rest when it starts.
    (Auxiliary peers exchange with trainers only.) None in a project whose rounds run in
    groups: a member exchanges with its group and its slot's reducers, which each round's
    plan decides, and a link to everyone is what groups are there to avoid."""
    if grouped:
        return []
    others = members.live(epoch) + ([] if peer.auxiliary else members.auxiliaries())
    senders = members.sends_only()
    candidates = [p for p in others
                  if p.peer_id != peer.peer_id and pairs.reachable(peer.peer_id, p.peer_id, now)
                  and not (peer.peer_id in senders and p.peer_id in senders)]
    candidates.sort(key=lambda p: (not (p.auxiliary or p.proven), p.peer_id))
    return [p.peer_id for p in candidates[:MAX_PARTNERS]]
