"""How a round ends: the first member that took the step advances the epoch (and the
ledger credits the members), those that diverged or failed resync, and pairs that could
not exchange are kept apart. Also: a step the peers took while the backbone was down."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from engine.backbone.ledger import credits
from engine.backbone.tracker.membership import PeerState
from engine.backbone.tracker.outputs import Broadcast, CollaborationState, Out, Record
from engine.backbone.tracker.scheduling import OpenRound
from engine.wire.control import RoundDone, Step

if TYPE_CHECKING:
    from engine.backbone.tracker import Tracker

log = logging.getLogger(__name__)


class Settlement:
    def __init__(self, tracker: Tracker) -> None:
        self.t = tracker

    def round_done(self, peer: PeerState, msg: RoundDone) -> list[Out]:
        t = self.t
        rnd = t.round
        if rnd is None or msg.round_id != rnd.round_id:
            return self._replayed_step(peer, msg)
        if peer.peer_id not in rnd.group or peer.peer_id in rnd.outcomes:
            return []
        rnd.outcomes[peer.peer_id] = msg
        out: list[Out] = []
        if msg.ok and msg.params_sha256:
            if rnd.advanced_to is None:
                out += self._advance(rnd, msg, msg.params_sha256)
            elif msg.params_sha256 != rnd.advanced_to:
                log.error("%s: peer %s diverged in round %d", t.project.id, peer.peer_id, rnd.round_id)
                out += t.resync(peer, "your step differs from the collaboration's")
            if msg.params_sha256 == rnd.advanced_to:
                peer.ready, peer.epoch = True, t.epoch
                t.members.restart_accumulation(peer)
        elif rnd.advanced_to is not None:
            out += t.resync(peer, "the round finished without you")
        if not msg.ok:
            for other in msg.unreachable:
                if other in rnd.group and other != peer.peer_id:
                    t.pairs.keep_apart(peer.peer_id, other)
        return out + t.sources.answer_waiting(patient=True) + self.settle()

    def _advance(self, rnd: OpenRound, msg: RoundDone, params_sha256: str) -> list[Out]:
        t = self.t
        now = t.clock()
        rnd.advanced_to = params_sha256
        t.epoch = rnd.epoch + 1
        t.params_sha256 = params_sha256
        t.recorded_epoch = t.epoch
        step = Step(epoch=t.epoch, round_id=rnd.round_id, loss=msg.loss, samples=msg.samples,
                    peers=len(rnd.group), round_seconds=round(now - rnd.opened_at, 3),
                    params_sha256=params_sha256)
        out: list[Out] = [
            Record(step, credits(msg.confirmed, {p: m.claim(now) for p, m in rnd.members.items()})),
            Broadcast(step),
        ]
        if rnd.checkpoint_by is not None:
            t.expected_checkpoints.add((rnd.checkpoint_by, t.epoch))
        t.pairs.exchanged(rnd.group)
        for p in t.members.peers.values():
            # A paused peer is told when it resumes: downloading the state now would take
            # the machine its owner asked back.
            if p.ready and not p.paused and p.peer_id not in rnd.group:
                out += t.resync(p, "an epoch finished while you were not in the round")
        return out

    def settle(self) -> list[Out]:
        """Close the open round once every member still here has answered."""
        rnd = self.t.round
        if rnd is None or not rnd.settled(set(self.t.members.peers)):
            return []
        return self.close(rnd)

    def close(self, rnd: OpenRound) -> list[Out]:
        t = self.t
        t.round = None
        out: list[Out] = t.sources.answer_waiting(patient=False)
        if rnd.advanced_to is None:
            log.info("%s: round %d for epoch %d failed", t.project.id, rnd.round_id, rnd.epoch)
            t.scheduler.retry_later()
        for pid in rnd.group:
            peer = t.members.get(pid)
            if peer is not None and pid not in rnd.outcomes:
                out += t.resync(peer, "you did not finish the round in time")
        return out

    def adopt(self, peer: PeerState, epoch: int, params_sha256: str) -> list[Out]:
        t = self.t
        log.warning("%s: adopting epoch %d from %s", t.project.id, epoch, peer.peer_id)
        t.epoch, t.params_sha256 = epoch, params_sha256
        t.recorded_epoch = max(t.recorded_epoch, epoch)
        out: list[Out] = [CollaborationState(epoch, params_sha256)]
        for other in t.members.peers.values():
            if other.ready and other.peer_id != peer.peer_id:
                out += t.resync(other, f"the collaboration is at epoch {epoch}")
        return out

    def _replayed_step(self, peer: PeerState, msg: RoundDone) -> list[Out]:
        """A peer back after we restarted tells how its last round ended. If that round took
        the step for our current epoch and we never recorded it (we died first), record it --
        the learning curve and the checkpoint checks need every epoch -- but credit nobody:
        the bounds that judge claims died with the previous process, and a replay is one
        peer's word."""
        t = self.t
        if (peer.ready or t.round is not None or not msg.ok or not msg.params_sha256
                or msg.epoch != t.epoch or t.recorded(msg.epoch + 1)):
            return []
        step = Step(epoch=msg.epoch + 1, round_id=msg.round_id, loss=msg.loss, samples=msg.samples,
                    peers=len(msg.confirmed), round_seconds=round(msg.seconds, 3),
                    params_sha256=msg.params_sha256)
        return [Record(step), *self.adopt(peer, msg.epoch + 1, msg.params_sha256)]
