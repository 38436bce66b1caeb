"""The collaboration's bookkeeper: who is in sync, when a round opens, what an epoch achieved.

Pure logic: methods take what happened and return what to send and record (outputs.py),
so every rule is tested without a network. One Tracker per project, in parts:
membership.py (who is here, what each reported), pairs.py (who reaches whom),
scheduling.py (when a round opens, with whom), backups.py (members lost midway),
settlement.py (how it ends),
syncing.py (where a peer that is behind gets the state).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace

from msgspec.structs import replace as struct_replace

from engine.backbone.tracker.backups import Backups
from engine.backbone.tracker.checkpoint_requests import CheckpointRequests
from engine.backbone.tracker.checks import Auditor
from engine.backbone.tracker.heldout import HeldOutScores
from engine.backbone.tracker.membership import Members, PeerState, unreported
from engine.backbone.tracker.nudges import Nudges
from engine.backbone.tracker.outputs import (
    Broadcast,
    CollaborationState,
    Out,
    RecordCredits,
    RecordHeldOut,
    RecordStep,
    RoundOpened,
    Send,
    WithdrawCredits,
)
from engine.backbone.tracker.pairs import Pairs
from engine.backbone.tracker.partners import partners
from engine.backbone.tracker.scheduling import OpenRound, Scheduler
from engine.backbone.tracker.settlement import Settlement
from engine.backbone.tracker.standing import Identity
from engine.backbone.tracker.syncing import StateSources
from engine.project import ProjectSpec
from engine.wire.control import (
    AuditDone,
    Availability,
    BadState,
    CheckpointInfo,
    ControlMessage,
    Evaluated,
    Partners,
    Progress,
    Ready,
    Resync,
    RoundDone,
    RoundStart,
    Status,
    SyncRequest,
)
from engine.wire.types import MAX_SECONDS, PeerRole, total_count, total_rate

__all__ = ["Broadcast", "CollaborationState", "Identity", "Out", "RecordCredits", "RecordHeldOut",
           "RecordStep", "RoundOpened", "Send", "Tracker", "WithdrawCredits"]


class Tracker:
    """One project's collaboration as the backbone runs it: who is in it, when a round
    opens, what it settles, who is credited. Pure: messages in, outputs out (outputs.py),
    on a clock it is given, so every rule is tested without a network; the server applies
    the outputs (sends, records) and holds the lease that makes this process the one that
    runs it."""

    def __init__(
        self,
        project: ProjectSpec,
        *,
        epoch: int = 0,
        state_sha256: str | None = None,
        checkpoint: CheckpointInfo | None = None,
        clock: Callable[[], float] = time.monotonic,
        peer_timeout: float = 15.0,
        round_grace: float = 5.0,
        retry_delay: float = 1.0,
        join_grace: float = 30.0,
        last_round_id: int = 0,
        pair_cooldown: float = 30.0,
        unsettled: RoundOpened | None = None,
        recovery: float = 0.0,
        rng: random.Random | None = None,
        equal_shares: bool = False,
    ) -> None:
        self.project = project
        self.epoch = epoch
        self.state_sha256 = state_sha256
        self.checkpoint = checkpoint
        self.round: OpenRound | None = None
        self.round_grace = round_grace
        self.checkpoint_requests = CheckpointRequests(clock)
        self.clock = clock
        self.members = Members(clock, peer_timeout)
        self.pairs = Pairs(project.id, clock, pair_cooldown)
        self.scheduler = Scheduler(project, self.members, self.pairs, clock, retry_delay=retry_delay,
                                   join_grace=join_grace, last_round_id=last_round_id,
                                   equal_shares=equal_shares)
        self.scheduler.chore_rank = self.checkpoint_requests.rank
        # After a restart the peers holding the recorded epoch are reconnecting, each after
        # its own backoff: for this long, a peer asking for the state waits for them rather
        # than the collaboration going back to an older checkpoint (or starting over).
        self.sources = StateSources(self, holders_due=clock() + recovery if epoch > 0 else 0.0)
        self.settlement = Settlement(self)
        self.audits = Auditor(self, rng)
        self.backups = Backups(self)
        self.heldout = HeldOutScores()
        self.nudges = Nudges()
        if unsettled is not None and unsettled.epoch == epoch:
            # We died while this round was under way: its members replay how it ended, and it
            # settles on what a majority of them say, as it would have.
            now = clock()
            self.round = OpenRound(unsettled.round_id, epoch, unsettled.voters, [1.0] * len(unsettled.voters),
                                   opened_at=now, deadline=now + project.round_timeout, checkpoint_by=None,
                                   members={}, timeout=project.round_timeout, recovering=True)

    @property
    def peers(self) -> dict[str, PeerState]:
        return self.members.peers

    @property
    def join_grace(self) -> float:
        return self.scheduler.join_grace

    @join_grace.setter
    def join_grace(self, seconds: float) -> None:
        self.scheduler.join_grace = seconds

    # --- membership -----------------------------------------------------------------------

    def join(self, peer_id: str, name: str, role: PeerRole = PeerRole.TRAINER,
             identity: Identity | None = None) -> list[Out]:
        """A peer's control socket opened (``identity``: its account and address group,
        by which its punishments outlive the socket)."""
        self.members.join(peer_id, name, auxiliary=role is PeerRole.AUXILIARY, identity=identity)
        return []

    def leave(self, peer_id: str) -> list[Out]:
        out = self.backups.lost(peer_id)
        self.members.leave(peer_id)
        self.checkpoint_requests.left(peer_id)
        return out + self.settlement.close_if_answered()

    def live_peers(self) -> list[PeerState]:
        return self.members.live(self.epoch)

    # --- messages ---------------------------------------------------------------------------

    def handle(self, peer_id: str, msg: ControlMessage) -> list[Out]:
        peer = self.members.get(peer_id)
        if peer is None:
            return []
        if peer.auxiliary:
            return self._from_auxiliary(peer, msg)
        if isinstance(msg, Evaluated):
            record = self.heldout.scored(peer_id, msg)
            return [record] if record else []
        if isinstance(msg, Progress):
            return self._answered(peer, msg, self._progress(peer, msg))
        if isinstance(msg, SyncRequest):
            return self.settlement.abandoned(peer) + self.sources.request(peer, msg)
        if isinstance(msg, Ready):
            return [*self.sources.ready(peer, msg), Send(peer_id, self.status_for(peer_id))]
        if isinstance(msg, RoundDone):
            return self.backups.gave_up(peer.peer_id, msg) + self.settlement.round_done(peer, msg)
        if isinstance(msg, AuditDone):
            return self.settlement.audit_done(peer, msg)
        if isinstance(msg, Availability):
            return self._availability(peer, msg)
        if isinstance(msg, BadState):
            return self.sources.bad_state(peer, msg)
        return []

    def _from_auxiliary(self, peer: PeerState, msg: ControlMessage) -> list[Out]:
        """An auxiliary peer holds no state and brings no gradient: it reports its link,
        reduces parts and shows them to checkers; the rest is not its to say."""
        if isinstance(msg, Progress):
            first = peer.heard_at == 0.0
            self.members.report_link(peer, msg, self.clock())
            # (the first time: it links to the trainers before its first round)
            linked_with = partners(self.members, self.pairs, peer, self.epoch, self.clock()) if first else []
            return [Send(peer.peer_id, Partners(peers=linked_with))] if linked_with else []
        if isinstance(msg, RoundDone):
            return self.settlement.round_done(peer, msg)
        if isinstance(msg, Availability):
            peer.paused = msg.paused
        return []

    def _availability(self, peer: PeerState, msg: Availability) -> list[Out]:
        peer.paused = msg.paused
        if msg.paused:
            return []
        if peer.ready and peer.epoch != self.epoch and not self.in_round(peer.peer_id):
            # Epochs passed while its owner had the machine: catch up now, not while paused.
            return self.resync(peer, f"the collaboration is at epoch {self.epoch}")
        return self._maybe_open_round()

    def _progress(self, peer: PeerState, msg: Progress) -> list[Out]:
        if not peer.ready:
            return []
        if msg.epoch != self.epoch:
            # Behind: it missed a step. Ahead: the collaboration rewound to a checkpoint
            # while this peer was paused or away. Either way the record decides.
            if not self.in_round(peer.peer_id):
                return self.resync(peer, f"the collaboration is at epoch {self.epoch}")
            return []
        if peer.epoch != self.epoch and not self.in_round(peer.peer_id):
            # It says it holds the current epoch, but we never saw it get there (its step was
            # never judged, or the round closed without it): show us.
            return self.resync(peer, f"your step to epoch {self.epoch} was not judged")
        now = self.clock()
        self.members.report(peer, msg, now)
        rnd = self.round
        if (rnd is not None and rnd.settled_to is None and peer.peer_id in rnd.members
                and msg.samples >= rnd.members[peer.peer_id].samples):
            # The micro-batch that was under way when the round opened, reported: evidence
            # (its cap was sent with the round, and stays).
            cap = rnd.members[peer.peer_id].cap
            rnd.members[peer.peer_id] = replace(self.members.pace(peer, now), cap=cap)
        if not self.members.may_reach(self.project.target_batch_size, peer, self.epoch, now):
            return []
        return self._maybe_open_round()

    def _answered(self, peer: PeerState, msg: Progress, out: list[Out]) -> list[Out]:
        """A report that may reach the target waits for an answer: the round it opened,
        a resync, or else the status (also to a peer that stepped before its round settled).
        Once per count: a status costs a pass over the members, and a stranger repeating
        its report would otherwise buy one with each message. Not a report of the next
        epoch, before it settled: the status of this one would tell the peer the others
        hold nothing (the Step tells it to report again)."""
        if not msg.asks_status or not peer.ready or msg.epoch != self.epoch or any(
                isinstance(o, Send) and o.to == peer.peer_id and isinstance(o.msg, (RoundStart, Resync))
                for o in out):
            return out
        asked = (msg.epoch, msg.samples)
        if peer.answered == asked:
            return out
        peer.answered = asked
        status, counted = self.status_and_counted()
        nudged = [Send(p, status) for p in self.nudges.due(self.epoch, peer.peer_id, counted, self.clock())]
        return [*out, Send(peer.peer_id, self._status_to(peer.peer_id, status, counted)), *nudged]

    def resync(self, peer: PeerState, reason: str) -> list[Out]:
        peer.ready = False
        return [Send(peer.peer_id, Resync(self.epoch, reason, self.state_sha256))]

    # --- rounds -----------------------------------------------------------------------------

    def in_round(self, peer_id: str) -> bool:
        return self.round is not None and peer_id in self.round.group

    def _maybe_open_round(self) -> list[Out]:
        if self.round is not None:
            return []
        stored = self.checkpoint.epoch if self.checkpoint else 0
        rnd = self.scheduler.open(self.epoch, max(stored, self.checkpoint_requests.newest_epoch() or 0))
        if rnd is None:
            return []
        self.round = rnd
        start = rnd.start()
        return [RoundOpened(rnd.round_id, rnd.epoch, rnd.voters), *(Send(pid, start) for pid in rnd.group)]

    def tick(self) -> list[Out]:
        """Deadlines (a round's, the wait for a restart's peers): called about every quarter second."""
        rnd = self.round
        if rnd is not None and rnd.audit is not None and rnd.settled_to is None:
            out = self.settlement.audited(rnd, self.audits.tick(rnd))
            if out or self.round is not rnd:
                return out
        if rnd is not None and self.clock() > rnd.deadline + self.round_grace:
            return self.settlement.close(rnd)
        if rnd is not None and self.clock() > self.settlement.reports_due(rnd):
            out = self.settlement.close_if_answered()  # without an auxiliary member silent so long
            if self.round is not rnd:
                return out
        return self.sources.recovery_over() + self._maybe_open_round()

    # --- checkpoints and status ---------------------------------------------------------

    def expects_checkpoint(self, peer_id: str, epoch: int) -> bool:
        return self.checkpoint_requests.expects(peer_id, epoch)

    def checkpoint_upload(self, peer_id: str, epoch: int, started: bool) -> bool:
        """An asked-for upload began (it is waited for however long it takes; False if one
        already runs), or ended without a stored file (the chore goes to another)."""
        if started:
            return self.checkpoint_requests.started(peer_id, epoch)
        self.checkpoint_requests.ended(peer_id, epoch, stored=False)
        return True

    def checkpoint_stored(self, peer_id: str, info: CheckpointInfo) -> None:
        self.checkpoint_requests.ended(peer_id, info.epoch, stored=True, size=info.size)
        if self.checkpoint is None or info.epoch >= self.checkpoint.epoch:
            self.checkpoint = info

    def status(self) -> Status:
        return self.status_and_counted()[0]

    def status_for(self, peer_id: str) -> Status:
        """The status as ``peer_id`` is told it: at once when it becomes ready, so that a
        newcomer knows from its first micro-batch whether its samples count yet; in answer
        to its ask, with the age of the others' counts (its own is fresh)."""
        return self._status_to(peer_id, *self.status_and_counted())

    def _status_to(self, peer_id: str, status: Status, counted: dict[str, PeerState]) -> Status:
        me = counted.get(peer_id)
        if me is None:
            return struct_replace(status, counts_you=False)
        others = [p for p in counted.values() if p is not me]
        return struct_replace(status, counts_age=unreported(others, self.clock())[1])

    def status_and_counted(self) -> tuple[Status, dict[str, PeerState]]:
        """The status, and the peers whose samples it counts (to whom ``counts_you`` holds)."""
        counted = self.members.counted(self.epoch)
        samples = total_count(p.samples for p in counted)
        if self.round is None and self.scheduler.grouped_samples is not None:
            samples = min(samples, self.scheduler.grouped_samples)
        rate = total_rate(p.rate for p in counted)
        target = self.project.target_batch_size
        eta = min(max(target - samples, 0) / rate, MAX_SECONDS) if rate > 0 else None
        pace, age = unreported(counted, self.clock())
        status = Status(self.epoch, samples, target, len(self.members.peers), rate, eta,
                        counts_age=age, pace=pace)
        return status, {p.peer_id: p for p in counted}

