"""Where a peer that is behind gets the collaboration's state: a live peer it can reach, the
latest checkpoint, or a fresh model -- always with the settled hash to check it against --
and when it is ready to take part again. A peer's Ready never moves the collaboration:
it is accepted only for the settled epoch and state."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from engine.backbone.tracker.membership import PeerState
from engine.backbone.tracker.outputs import CollaborationState, Out, Send
from engine.backbone.tracker.partners import partners
from engine.wire.control import BadState, Partners, Ready, SyncPlan, SyncRequest
from engine.wire.types import StateSource

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.backbone.tracker.membership import Members, PeerState
    from engine.backbone.tracker.outputs import Out
    from engine.backbone.tracker.pairs import Pairs
    from engine.backbone.tracker.scheduling import OpenRound
    from engine.project import ProjectSpec
    from engine.wire.control import CheckpointInfo

log = logging.getLogger(__name__)


class SyncingTracker(Protocol):
    """What finding a state source needs of the tracker."""

    project: ProjectSpec
    clock: Callable[[], float]
    members: Members
    pairs: Pairs
    round: OpenRound | None
    epoch: int
    state_sha256: str | None
    checkpoint: CheckpointInfo | None

    def resync(self, peer: PeerState, reason: str) -> list[Out]: ...


class StateSources:
    def __init__(self, tracker: SyncingTracker, holders_due: float = 0.0) -> None:
        self.t = tracker
        self.holders_due = holders_due  # until then, a restart's peers may still come back
        self._deferred = False  # an asker waits for them

    def request(self, peer: PeerState, msg: SyncRequest) -> list[Out]:
        peer.ready = False
        if peer.syncing_since is None:  # asking again does not restart the rounds' wait for it
            peer.syncing_since = self.t.clock()
        peer.sync_request = msg
        return self._answer(peer, patient=True)

    def bad_state(self, peer: PeerState, msg: BadState) -> list[Out]:
        """A joiner says the donor we named it served state that did not check out. One
        peer's word costs the donor nothing but being asked later than donors fewer peers
        accuse (it may be the joiner that lies); a peer counts once, and only against the
        donor it was sent to."""
        donor = self.t.members.get(msg.peer)
        if donor is not None and donor is not peer and peer.donor == msg.peer:
            if peer.peer_id not in donor.accusers:  # (logged once: the reason is a stranger's text)
                donor.accusers.add(peer.peer_id)
                log.warning("%s: %s says %s served bad state: %r", self.t.project.id, peer.peer_id,
                            msg.peer, msg.reason[:200])
        elif donor is None and peer.donor == msg.peer and peer.syncing_since is not None:
            # The joiner's word on a donor that left as it served: logged once per download.
            peer.donor = None
            log.info("%s: %s blames %s for bad state, not counted: it is no member now",
                     self.t.project.id, peer.peer_id, msg.peer)
        return []

    def answer_waiting(self, patient: bool) -> list[Out]:
        out: list[Out] = []
        for peer in list(self.t.members.peers.values()):
            if peer.sync_request is not None:
                out += self._answer(peer, patient)
        return out

    def recovery_over(self) -> list[Out]:
        """Once the peers of a restart had their time to come back: answer who waited."""
        if not self._deferred or self.t.clock() < self.holders_due:
            return []
        self._deferred = False
        return self.answer_waiting(patient=False)

    def _answer(self, peer: PeerState, patient: bool) -> list[Out]:
        """Tell ``peer`` where to get the state -- or nothing yet: when ``patient`` and no peer
        it can reach holds the epoch but one is about to (a member of the round under way
        that has not reported; asking one it cannot reach would stall its download), or when
        nobody holds it but, just after a restart, its holders may still be coming back."""
        t, pairs = self.t, self.t.pairs
        msg = peer.sync_request
        assert msg is not None
        donors = [p for p in t.members.peers.values()
                  if p.ready and p.epoch == t.epoch and p.peer_id != peer.peer_id and not p.paused]
        now = t.clock()
        untried = [p for p in donors if p.peer_id not in msg.exclude]
        reachable = [p for p in untried if pairs.reachable(peer.peer_id, p.peer_id, now)]
        rnd = t.round
        if patient and not reachable and rnd is not None and any(
                m != peer.peer_id and m not in rnd.outcomes and m in t.members.peers
                and m not in rnd.auxiliary and pairs.reachable(peer.peer_id, m, now) for m in rnd.group):
            return []  # answered when the round's members report (or it closes)
        checkpoint = t.checkpoint
        if (not donors and now < self.holders_due
                and (checkpoint is None or checkpoint.epoch != t.epoch)):
            self._deferred = True
            return []  # going back now would lose the epochs its holders are bringing back
        peer.sync_request = None
        if t.epoch == 0 and checkpoint is None:
            # Epoch 0 is the project's seed: every peer builds it alone, nobody downloads it.
            return [Send(peer.peer_id, SyncPlan(0, StateSource.INIT, state_sha256=t.state_sha256))]
        if donors:
            if not untried and checkpoint is not None and checkpoint.epoch == t.epoch:
                # Every peer holding this epoch failed to serve it; the checkpoint holds it too.
                return [Send(peer.peer_id, SyncPlan(t.epoch, StateSource.CHECKPOINT, checkpoint=checkpoint,
                                                    state_sha256=t.state_sha256))]
            usable = reachable or untried or donors
            # A silent peer may be hung, and a pair whose last exchange failed may still be
            # cut off (its cooldown over, but not yet proven): ask the others first.
            donor = min(usable, key=lambda p: (
                now - p.heard_at > t.members.peer_timeout, pairs.failed_lately(peer.peer_id, p.peer_id),
                len(p.accusers), p.serving, p.joined_at))
            self.release_donor(peer)
            donor.serving += 1
            peer.donor = donor.peer_id
            return [Send(peer.peer_id, SyncPlan(t.epoch, StateSource.PEER, peer=donor.peer_id,
                                                state_sha256=t.state_sha256))]
        if checkpoint is not None:
            if t.epoch != checkpoint.epoch:
                log.warning("%s: no live peer holds epoch %d; resuming from the checkpoint of epoch %d",
                            t.project.id, t.epoch, checkpoint.epoch)
            t.epoch, t.state_sha256 = checkpoint.epoch, checkpoint.state_sha256
            plan = SyncPlan(t.epoch, StateSource.CHECKPOINT, checkpoint=checkpoint,
                            state_sha256=t.state_sha256)
            return [CollaborationState(t.epoch, t.state_sha256), Send(peer.peer_id, plan)]
        if t.epoch != 0:
            log.warning("%s: no live peer and no checkpoint; starting over from epoch 0", t.project.id)
            t.epoch, t.state_sha256 = 0, None
            return [CollaborationState(0, None), Send(peer.peer_id, SyncPlan(0, StateSource.INIT))]
        return [Send(peer.peer_id, SyncPlan(0, StateSource.INIT, state_sha256=t.state_sha256))]

    def release_donor(self, peer: PeerState) -> None:
        donor = self.t.members.get(peer.donor or "")
        if donor is not None:
            donor.serving = max(donor.serving - 1, 0)
        peer.donor = None

    def ready(self, peer: PeerState, msg: Ready) -> list[Out]:
        """The peer holds the state of ``msg.epoch``: in rounds from now on, if that is the
        settled one (before the first settlement, epoch 0's seed state: rounds settle it)."""
        t = self.t
        self.release_donor(peer)
        peer.syncing_since = None
        rnd = t.round
        if (rnd is not None and rnd.recovering and peer.peer_id in rnd.group
                and msg.epoch == rnd.epoch + 1 and peer.peer_id in rnd.outcomes):
            return []  # it took the round we are recovering: its replayed outcome decides
        if msg.epoch != t.epoch:
            return t.resync(peer, f"the collaboration is at epoch {t.epoch}, not {msg.epoch}")
        if t.state_sha256 is not None and msg.state_sha256 != t.state_sha256:
            return t.resync(peer, "your state differs from the collaboration's")
        if peer.ready and peer.epoch == msg.epoch:
            return []  # nothing new: its accumulation (and the time it is judged by) goes on
        if peer.epoch != msg.epoch:
            t.members.restart_accumulation(peer)
        # (Else it is back at the state it kept from before a step that did not settle, with
        # the gradient it brought to that step: it accumulated since the time it had.)
        peer.ready, peer.epoch = True, msg.epoch
        out = self.answer_waiting(patient=True)  # it may serve those asking
        linked_with = partners(t.members, t.pairs, peer, msg.epoch, t.clock(),
                               t.project.group_size is not None)
        return [*out, Send(peer.peer_id, Partners(peers=linked_with))] if linked_with else out
