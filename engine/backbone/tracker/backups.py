"""Members lost mid-round: their control socket closed (the app was killed, or its
machine or network went away: the socket's heartbeat notices in about 20 s). Without
this, every peer would wait for the lost one's part or result until the round's
deadline, and the round would be redone.

The tracker tells the others (Reassign): stop waiting for the lost member, and send the
parts it was reducing to a backup -- the live voter with the largest share, the one the LP
found fastest; in a grouped round, of the lost one's group, where it takes the lost one's
slot and its place among the slot's reducers across groups (planning/slot_reducers.py).
Only the backbone's own observation loses a member: no peer can make
another look dead. A lost member votes on nothing and is credited with nothing."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from engine.backbone.tracker.outputs import Out, Send
from engine.backbone.tracker.scheduling import OpenRound
from engine.wire.control import Reassign, RoundDone

if TYPE_CHECKING:
    from engine.backbone.tracker.membership import Members
    from engine.project import ProjectSpec

log = logging.getLogger(__name__)


def backup_reducer(rnd: OpenRound, lost: str, sends_only: set[str]) -> str | None:
    """Who takes over a lost reducer's parts: a live voter that accepts connections and is
    still in the round (one that answered has finished it), reducing the most already (the
    LP found its links the best); None if nobody can. Not an auxiliary member: it is done
    once its own parts are, and the backbone cannot tell when that is before it reports."""
    share = rnd.weights()
    candidates = [p for p in rnd.voters if p not in sends_only and p not in rnd.outcomes]
    if rnd.groups is not None:
        # A grouped round's: of the lost one's group, whose members all send it the slot
        # already (and the group's other slot reducers have links to every one of them).
        group = next(g for g in rnd.groups.groups if lost in g)
        candidates = [p for p in candidates if p in group]
    if not candidates:
        return None
    return max(candidates, key=lambda p: (share[p], -rnd.group.index(p)))


class RoundKeeper(Protocol):
    """What a round's backups need of the tracker."""

    project: ProjectSpec
    members: Members
    round: OpenRound | None


class Backups:
    def __init__(self, tracker: RoundKeeper) -> None:
        self.t = tracker
        self.reassigned = 0  # parts handed to a backup since the backbone started

    def lost(self, peer_id: str) -> list[Out]:
        """``peer_id`` is gone from the round under way: hand its parts on, tell the rest."""
        t, rnd = self.t, self.t.round
        if rnd is None or rnd.settled_to is not None or peer_id not in rnd.group or peer_id in rnd.lost:
            return []
        if peer_id in rnd.outcomes:
            return []  # it had finished: its step stands, and its results went out
        rnd.lost.add(peer_id)
        orphaned = [j for j, r in enumerate(rnd.reducers) if r == peer_id and rnd.share_of(j) > 0]
        backup = backup_reducer(rnd, peer_id, t.members.sends_only()) if orphaned else None
        if orphaned and backup is None:
            # The round fails at once on every member, rather than at its deadline.
            log.warning("%s: round %d: %s left with parts to reduce, and no member can take them over",
                        t.project.id, rnd.round_id, peer_id)
        elif backup is not None:
            for j in orphaned:
                rnd.reducers[j] = backup
            self.reassigned += len(orphaned)
            log.warning("%s: round %d: %s left mid-round; %s reduces its part now", t.project.id,
                        rnd.round_id, peer_id, backup)
        else:
            log.info("%s: round %d: %s left mid-round", t.project.id, rnd.round_id, peer_id)
        return self._tell(rnd)

    def gave_up(self, peer_id: str, msg: RoundDone) -> list[Out]:
        """A backup of a grouped round failed it: the slots it took over cannot be finished
        (their lost reducer had finished a piece of them and sent it to some before it left,
        averaging/stand_ins.py). Tell every member the slots have nobody now: they fail the
        round at once, rather than wait for what will not come until its deadline."""
        rnd = self.t.round
        if msg.ok or rnd is None or rnd.groups is None or msg.round_id != rnd.round_id:
            return []
        taken = [j for j, r in enumerate(rnd.reducers) if r == peer_id and rnd.group[j] in rnd.lost]
        if not taken:
            return []
        for j in taken:
            rnd.reducers[j] = rnd.group[j]
        left = ", ".join(sorted({rnd.group[j] for j in taken}))
        log.warning("%s: round %d: backup %s could not finish what %s left: the round fails",
                    self.t.project.id, rnd.round_id, peer_id, left)
        return self._tell(rnd)

    def _tell(self, rnd: OpenRound) -> list[Out]:
        msg = Reassign(round_id=rnd.round_id, epoch=rnd.epoch, lost=sorted(rnd.lost),
                       reducers=list(rnd.reducers))
        return [Send(p, msg) for p in rnd.group if p not in rnd.lost and p in self.t.members.peers]
