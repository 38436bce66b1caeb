"""The collaboration's bookkeeper: who is in sync, when a round opens, what an epoch achieved.

Pure logic: methods take what happened and return what to send and record, so every
rule here is tested without a network. One Tracker per project.
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.backbone.ledger import Claim, Credit, credits
from engine.project import ProjectSpec
from engine.wire.messages import (
    Availability,
    CheckpointInfo,
    EpochAdvanced,
    Progress,
    Ready,
    Resync,
    RoundDone,
    RoundStart,
    Status,
    SyncPlan,
    SyncRequest,
)

log = logging.getLogger(__name__)
PACE_DECAY = 0.9
BEST_DECAY = 0.995
# Progress reports between two counts of the live peers' samples only add what they report:
# summing a thousand peers on each of their reports cost the backbone a third of its time.
RECOUNT_INTERVAL = 0.1
MAX_PAIR_COOLDOWN = 600.0  # lets one freak measurement fade over a few hundred reports


@dataclass
class Send:
    to: str
    msg: object


@dataclass
class Broadcast:
    msg: object


@dataclass
class EpochRecord:
    """A completed global step; ``epoch`` counts steps, this one included."""

    round_id: int
    epoch: int
    loss: float | None
    samples: int
    peers: int
    round_seconds: float
    params_sha256: str
    credits: dict[str, Credit] = field(default_factory=dict)


@dataclass
class CollaborationState:
    """The epoch and parameters the collaboration continues from changed without a step
    (a rewind to a checkpoint, a fresh start, or a step adopted after a crash)."""

    epoch: int
    params_sha256: str | None


Out = Send | Broadcast | EpochRecord | CollaborationState


@dataclass
class PeerState:
    peer_id: str
    name: str
    joined_at: float
    ready: bool = False
    epoch: int = -1
    samples: int = 0
    rate: float = 0.0
    loss: float | None = None
    reported_at: float = 0.0  # its last report of new samples: paces and claims
    heard_at: float = 0.0  # its last report of any kind: liveness
    accumulating_since: float = 0.0
    compute_seconds: float = 0.0
    pace: float = 0.0  # samples/s between its reports, timed here; carried across epochs
    throughput: float = 0.0  # samples per second of compute, as it reports them
    best_throughput: float = 0.0
    micro_batch: int = 0  # smallest jump between two of its reports: one micro-batch
    serving: int = 0
    donor: str | None = None
    syncing_since: float | None = None
    paused: bool = False  # its owner needs the machine: not in rounds, not a donor
    sync_request: SyncRequest | None = None  # asked where to get the state, not answered yet
    client_mode: bool = False  # reachable only through a relay: sends parts, reduces none


@dataclass
class Pace:
    """A round member's last report and speed, kept to judge its claim when the round ends."""

    samples: int
    rate: float
    micro_batch: int
    reported_at: float
    compute_seconds: float
    accumulating_since: float
    best_throughput: float

    def claim(self, ended_at: float) -> Claim:
        # The first success needed every member's parts, so each member had stopped
        # accumulating by then: its unreported work fits before ``ended_at``.
        return Claim(self.samples, self.rate, self.micro_batch, ended_at - self.reported_at,
                     self.compute_seconds, ended_at - self.accumulating_since, self.best_throughput)


@dataclass
class OpenRound:
    round_id: int
    epoch: int
    group: list[str]
    opened_at: float
    deadline: float
    checkpoint_by: str | None
    members: dict[str, Pace]  # what each member had reported, refreshed during the round
    outcomes: dict[str, RoundDone] = field(default_factory=dict)
    advanced_to: str | None = None  # params hash of the first success

    def settled(self, alive: set[str]) -> bool:
        return all(p in self.outcomes or p not in alive for p in self.group)


class Tracker:
    def __init__(
        self,
        project: ProjectSpec,
        *,
        epoch: int = 0,
        params_sha256: str | None = None,
        checkpoint: CheckpointInfo | None = None,
        clock: Callable[[], float] = time.monotonic,
        peer_timeout: float = 15.0,
        round_grace: float = 5.0,
        retry_delay: float = 1.0,
        join_grace: float = 30.0,
        last_round_id: int = 0,
        pair_cooldown: float = 30.0,
    ) -> None:
        self.project = project
        self.epoch = epoch
        self.params_sha256 = params_sha256
        self.checkpoint = checkpoint
        self.peers: dict[str, PeerState] = {}
        self.round: OpenRound | None = None
        self.peer_timeout = peer_timeout
        self.round_grace = round_grace
        self.retry_delay = retry_delay
        self.join_grace = join_grace
        self.pair_cooldown = pair_cooldown
        self._unreachable: dict[frozenset[str], float] = {}  # pair -> until when it is kept apart
        self._strikes: dict[frozenset[str], int] = {}  # failed exchanges in a row, for backoff
        self._clock = clock
        self._retry_at = 0.0
        self._round_ids = itertools.count(last_round_id + 1)
        self._expected_checkpoints: set[tuple[str, int]] = set()
        self._recorded_epoch = epoch
        self._counted: dict[str, int] = {}  # samples per live peer as last counted, and reported since
        self._gathered = 0  # their sum
        self._counted_at = -math.inf

    # --- membership -----------------------------------------------------------------------

    def join(self, peer_id: str, name: str) -> list[Out]:
        self.peers[peer_id] = PeerState(peer_id, name, self._clock())
        return []

    def leave(self, peer_id: str) -> list[Out]:
        self.peers.pop(peer_id, None)
        self._expected_checkpoints = {c for c in self._expected_checkpoints if c[0] != peer_id}
        return self._settle_round()

    # --- messages ---------------------------------------------------------------------------

    def handle(self, peer_id: str, msg: object) -> list[Out]:
        peer = self.peers.get(peer_id)
        if peer is None:
            return []
        if isinstance(msg, Progress):
            return self._progress(peer, msg)
        if isinstance(msg, SyncRequest):
            return self._sync_request(peer, msg)
        if isinstance(msg, Ready):
            return self._ready(peer, msg)
        if isinstance(msg, RoundDone):
            return self._round_done(peer, msg)
        if isinstance(msg, Availability):
            return self._availability(peer, msg)
        return []

    def _availability(self, peer: PeerState, msg: Availability) -> list[Out]:
        peer.paused = msg.paused
        if msg.paused:
            return []
        if peer.ready and peer.epoch != self.epoch and not self._in_round(peer.peer_id):
            # Epochs passed while its owner had the machine: catch up now, not while paused.
            return self._resync(peer, f"the collaboration is at epoch {self.epoch}")
        return self._maybe_open_round()

    def _progress(self, peer: PeerState, msg: Progress) -> list[Out]:
        if not peer.ready:
            return []
        if msg.epoch != self.epoch:
            # Behind: it missed a step. Ahead: the collaboration rewound to a checkpoint
            # while this peer was paused or away. Either way the record decides.
            if not self._in_round(peer.peer_id):
                return self._resync(peer, f"the collaboration is at epoch {self.epoch}")
            return []
        now = self._clock()
        step = msg.samples - peer.samples
        if step > 0:
            peer.micro_batch = min(peer.micro_batch or step, step)
            if now > peer.reported_at:
                peer.pace = max(peer.pace * PACE_DECAY, step / (now - peer.reported_at))
        if msg.compute_seconds > 0:
            peer.throughput = max(peer.throughput * PACE_DECAY, msg.samples / msg.compute_seconds)
            peer.best_throughput = max(peer.best_throughput * BEST_DECAY, msg.samples / msg.compute_seconds)
        peer.samples, peer.rate, peer.loss = msg.samples, msg.samples_per_second, msg.loss
        peer.compute_seconds, peer.client_mode = msg.compute_seconds, msg.client_mode
        peer.heard_at = now
        if step != 0:
            peer.reported_at = now
        rnd = self.round
        if (rnd is not None and rnd.advanced_to is None and peer.peer_id in rnd.members
                and msg.samples >= rnd.members[peer.peer_id].samples):
            # The micro-batch that was under way when the round opened, reported: evidence.
            rnd.members[peer.peer_id] = self._pace(peer, [peer])
        if not self._may_reach_target(peer, now):
            return []
        return self._maybe_open_round()

    def _may_reach_target(self, peer: PeerState, now: float) -> bool:
        """A cheap first test for the hot path: False only if the live peers' samples fall
        short of the target. Between counts the tally can overshoot (peers that went quiet),
        which merely runs the full test; it can miss samples that count again without a
        report (a peer resuming), which ``tick`` picks up within a quarter second."""
        if now - self._counted_at >= RECOUNT_INTERVAL:
            self._counted = {p.peer_id: p.samples for p in self.live_peers()}
            self._gathered = sum(self._counted.values())
            self._counted_at = now
        else:
            self._gathered += peer.samples - self._counted.get(peer.peer_id, 0)
            self._counted[peer.peer_id] = peer.samples
        return self._gathered >= self.project.target_batch_size

    def _sync_request(self, peer: PeerState, msg: SyncRequest) -> list[Out]:
        peer.ready = False
        peer.syncing_since = self._clock()
        peer.sync_request = msg
        return self._answer_sync(peer, patient=True)

    def _answer_waiting(self, patient: bool) -> list[Out]:
        out: list[Out] = []
        for peer in list(self.peers.values()):
            if peer.sync_request is not None:
                out += self._answer_sync(peer, patient)
        return out

    def _reachable(self, a: str, b: str, now: float) -> bool:
        return self._unreachable.get(frozenset((a, b)), 0.0) <= now

    def _may_download(self, peer: PeerState, now: float) -> bool:
        """Whether a syncing peer's download is worth holding rounds for: not from a donor
        it is kept apart from, or whose last exchange with it failed."""
        donor = peer.donor
        return donor is None or (self._reachable(peer.peer_id, donor, now)
                                 and not self._strikes.get(frozenset((peer.peer_id, donor))))

    def _answer_sync(self, peer: PeerState, patient: bool) -> list[Out]:
        """Tell ``peer`` where to get the state -- or, when ``patient`` and no peer it can
        reach holds the epoch yet but one is about to (a member of the round under way that
        has not reported), nothing yet: asking one it cannot reach would stall its download."""
        msg = peer.sync_request
        assert msg is not None
        donors = [p for p in self.peers.values()
                  if p.ready and p.epoch == self.epoch and p.peer_id != peer.peer_id and not p.paused]
        now = self._clock()
        untried = [p for p in donors if p.peer_id not in msg.exclude]
        reachable = [p for p in untried if self._reachable(peer.peer_id, p.peer_id, now)]
        rnd = self.round
        if patient and not reachable and rnd is not None and any(
                m != peer.peer_id and m not in rnd.outcomes and m in self.peers
                and self._reachable(peer.peer_id, m, now) for m in rnd.group):
            return []  # answered when the round's members report (or it closes)
        peer.sync_request = None
        if donors:
            checkpoint = self.checkpoint
            if not untried and checkpoint is not None and checkpoint.epoch == self.epoch:
                # Every peer holding this epoch failed to serve it; the checkpoint holds it too.
                return [Send(peer.peer_id, SyncPlan(self.epoch, "checkpoint", checkpoint=checkpoint,
                                                    params_sha256=self.params_sha256))]
            usable = reachable or untried or donors
            # A silent peer may be hung, and a pair whose last exchange failed may still be
            # cut off (its cooldown over, but not yet proven): ask the others first.
            donor = min(usable, key=lambda p: (
                now - p.heard_at > self.peer_timeout,
                self._strikes.get(frozenset((peer.peer_id, p.peer_id)), 0) > 0,
                p.serving, p.joined_at))
            self._release_donor(peer)
            donor.serving += 1
            peer.donor = donor.peer_id
            return [Send(peer.peer_id, SyncPlan(self.epoch, "peer", peer=donor.peer_id))]
        if self.checkpoint is not None:
            if self.epoch != self.checkpoint.epoch:
                log.warning("%s: no live peer holds epoch %d; resuming from the checkpoint of epoch %d",
                            self.project.id, self.epoch, self.checkpoint.epoch)
            self.epoch, self.params_sha256 = self.checkpoint.epoch, self.checkpoint.params_sha256
            return [CollaborationState(self.epoch, self.params_sha256),
                    Send(peer.peer_id, SyncPlan(self.epoch, "checkpoint", checkpoint=self.checkpoint,
                                                params_sha256=self.params_sha256))]
        if self.epoch != 0:
            log.warning("%s: no live peer and no checkpoint; starting over from epoch 0",
                        self.project.id)
            self.epoch, self.params_sha256 = 0, None
            return [CollaborationState(0, None), Send(peer.peer_id, SyncPlan(0, "init"))]
        return [Send(peer.peer_id, SyncPlan(0, "init", params_sha256=self.params_sha256))]

    def _release_donor(self, peer: PeerState) -> None:
        donor = self.peers.get(peer.donor or "")
        if donor is not None:
            donor.serving = max(donor.serving - 1, 0)
        peer.donor = None

    def _ready(self, peer: PeerState, msg: Ready) -> list[Out]:
        self._release_donor(peer)
        peer.syncing_since = None
        out: list[Out] = []
        if msg.epoch == self.epoch + 1 and self.round is None and not self._recorded(msg.epoch):
            # We crashed after this step completed but before it was recorded; the peers
            # that took it are ahead of us. Adopt their state rather than lose the step.
            out += self._adopt(peer, msg.epoch, msg.params_sha256)
        if msg.epoch != self.epoch:
            return self._resync(peer, f"the collaboration is at epoch {self.epoch}, not {msg.epoch}")
        if self.params_sha256 is not None and msg.params_sha256 != self.params_sha256:
            return self._resync(peer, "your parameters differ from the collaboration's")
        self.params_sha256 = msg.params_sha256
        peer.ready, peer.epoch = True, msg.epoch
        self._restart_accumulation(peer)
        return out

    def _recorded(self, epoch: int) -> bool:
        return epoch <= self._recorded_epoch

    def _adopt(self, peer: PeerState, epoch: int, params_sha256: str) -> list[Out]:
        log.warning("%s: adopting epoch %d from %s", self.project.id, epoch, peer.peer_id)
        self.epoch, self.params_sha256 = epoch, params_sha256
        self._recorded_epoch = max(self._recorded_epoch, epoch)
        out: list[Out] = [CollaborationState(epoch, params_sha256)]
        for other in self.peers.values():
            if other.ready and other.peer_id != peer.peer_id:
                out += self._resync(other, f"the collaboration is at epoch {epoch}")
        return out

    def _replayed_step(self, peer: PeerState, msg: RoundDone) -> list[Out]:
        """A peer back after we restarted tells how its last round ended. If that round took
        the step for our current epoch and we never recorded it (we died first), record it --
        the learning curve and the checkpoint checks need every epoch -- but credit nobody:
        the bounds that judge claims died with the previous process, and a replay is one
        peer's word."""
        if (peer.ready or self.round is not None or not msg.ok or not msg.params_sha256
                or msg.epoch != self.epoch or self._recorded(msg.epoch + 1)):
            return []
        record = EpochRecord(msg.round_id, msg.epoch + 1, msg.loss, msg.samples, len(msg.confirmed),
                             round(msg.seconds, 3), msg.params_sha256)
        return [record, *self._adopt(peer, msg.epoch + 1, msg.params_sha256)]

    def _restart_accumulation(self, peer: PeerState) -> None:
        peer.samples, peer.compute_seconds = 0, 0.0
        peer.reported_at = peer.heard_at = peer.accumulating_since = self._clock()

    def _round_done(self, peer: PeerState, msg: RoundDone) -> list[Out]:
        rnd = self.round
        if rnd is None or msg.round_id != rnd.round_id:
            return self._replayed_step(peer, msg)
        if peer.peer_id not in rnd.group or peer.peer_id in rnd.outcomes:
            return []
        rnd.outcomes[peer.peer_id] = msg
        out: list[Out] = []
        if msg.ok and msg.params_sha256:
            if rnd.advanced_to is None:
                out += self._advance(rnd, msg)
            elif msg.params_sha256 != rnd.advanced_to:
                log.error("%s: peer %s diverged in round %d", self.project.id, peer.peer_id, rnd.round_id)
                out += self._resync(peer, "your step differs from the collaboration's")
            if msg.params_sha256 == rnd.advanced_to:
                peer.ready, peer.epoch = True, self.epoch
                self._restart_accumulation(peer)
        elif rnd.advanced_to is not None:
            out += self._resync(peer, "the round finished without you")
        if not msg.ok:
            for other in msg.unreachable:
                if other in rnd.group and other != peer.peer_id:
                    self._keep_apart(frozenset((peer.peer_id, other)))
        return out + self._answer_waiting(patient=True) + self._settle_round()

    def _keep_apart(self, pair: frozenset[str]) -> None:
        """Back off a pair that failed to exchange: each retry that fails again doubles the
        wait (up to ``MAX_PAIR_COOLDOWN``), so a dead relay costs a round timeout now and
        then rather than every half minute."""
        if pair in self._unreachable and self._unreachable[pair] > self._clock():
            return  # both ends report the same failure
        strikes = self._strikes.get(pair, 0) + 1
        self._strikes[pair] = strikes
        cooldown = min(self.pair_cooldown * 2 ** (strikes - 1), MAX_PAIR_COOLDOWN)
        self._unreachable[pair] = self._clock() + cooldown
        log.info("%s: keeping %s apart for %.0fs", self.project.id, " and ".join(sorted(pair)), cooldown)

    def _advance(self, rnd: OpenRound, msg: RoundDone) -> list[Out]:
        now = self._clock()
        rnd.advanced_to = msg.params_sha256
        self.epoch = rnd.epoch + 1
        self.params_sha256 = msg.params_sha256
        self._recorded_epoch = self.epoch
        out: list[Out] = [
            EpochRecord(rnd.round_id, self.epoch, msg.loss, msg.samples, len(rnd.group),
                        round(self._clock() - rnd.opened_at, 3), msg.params_sha256 or "",
                        credits(msg.confirmed, {p: m.claim(now) for p, m in rnd.members.items()})),
            Broadcast(EpochAdvanced(self.epoch, msg.loss, msg.samples, msg.params_sha256 or "")),
        ]
        if rnd.checkpoint_by is not None:
            self._expected_checkpoints.add((rnd.checkpoint_by, self.epoch))
        for pair in [pair for pair in self._strikes if pair <= set(rnd.group)]:
            del self._strikes[pair]  # they exchanged fine: a later failure starts afresh
        for p in self.peers.values():
            # A paused peer is told when it resumes: downloading the state now would take
            # the machine its owner asked back.
            if p.ready and not p.paused and p.peer_id not in rnd.group:
                out += self._resync(p, "an epoch finished while you were not in the round")
        return out

    def _settle_round(self) -> list[Out]:
        rnd = self.round
        if rnd is None or not rnd.settled(set(self.peers)):
            return []
        return self._close_round(rnd)

    def _close_round(self, rnd: OpenRound) -> list[Out]:
        self.round = None
        out: list[Out] = self._answer_waiting(patient=False)
        if rnd.advanced_to is None:
            log.info("%s: round %d for epoch %d failed", self.project.id, rnd.round_id, rnd.epoch)
            self._retry_at = self._clock() + self.retry_delay
        for pid in rnd.group:
            peer = self.peers.get(pid)
            if peer is not None and pid not in rnd.outcomes:
                out += self._resync(peer, "you did not finish the round in time")
        return out

    # --- rounds -----------------------------------------------------------------------------

    def _in_round(self, peer_id: str) -> bool:
        return self.round is not None and peer_id in self.round.group

    def live_peers(self) -> list[PeerState]:
        now = self._clock()
        return [
            p for p in self.peers.values()
            if p.ready and not p.paused and p.epoch == self.epoch and now - p.heard_at <= self.peer_timeout
        ]

    def _maybe_open_round(self) -> list[Out]:
        now = self._clock()
        if self.round is not None or now < self._retry_at:
            return []
        live = self.live_peers()
        if not live or sum(p.samples for p in live) < self.project.target_batch_size:
            return []
        # A download still under way after a round's timeout holds the others no longer: its
        # donor may sit behind a link that died unnoticed (a NAT that rebound), and a
        # failed round would not have cost them more.
        hold = min(self.join_grace, self.project.round_timeout)
        if any(p.syncing_since is not None and now - p.syncing_since < hold
               and self._may_download(p, now) for p in self.peers.values()):
            # A joiner is downloading the current state. Opening the round now would make
            # that state stale on arrival; everyone keeps accumulating meanwhile, so
            # waiting costs a slightly larger batch, not wasted work.
            return []
        group = self._connected_group(live, now)
        members = [p for p in live if p.peer_id in group]
        if sum(p.samples for p in members) < self.project.target_batch_size:
            return []
        live = members
        last = self.checkpoint.epoch if self.checkpoint else 0
        due = self.epoch + 1 - last >= self.project.checkpoint_every
        rnd = OpenRound(
            round_id=next(self._round_ids), epoch=self.epoch, group=group, opened_at=now,
            deadline=now + self.project.round_timeout, checkpoint_by=group[0] if due else None,
            members={p.peer_id: self._pace(p, live) for p in live},
        )
        self.round = rnd
        start = RoundStart(rnd.round_id, rnd.epoch, group, self._shares(members, group),
                           self.project.round_timeout, rnd.checkpoint_by)
        log.info("%s: round %d for epoch %d with %d peers, %d samples", self.project.id,
                 rnd.round_id, rnd.epoch, len(group), sum(m.samples for m in rnd.members.values()))
        return [Send(pid, start) for pid in group]

    def _connected_group(self, live: list[PeerState], now: float) -> list[str]:
        """The largest set of peers that can all reach each other: a pair that just failed
        to exchange is kept apart for ``pair_cooldown``. Greedily, the peers that reach the
        most others first (then the most samples), so one cut-off peer never outranks a
        connected majority."""
        self._unreachable = {pair: t for pair, t in self._unreachable.items() if t > now}
        # Linear in peers plus pairs kept apart (few), not quadratic: a thousand peers open a
        # round without stalling the backbone.
        apart: dict[str, set[str]] = {p.peer_id: set() for p in live}
        for pair in self._unreachable:
            a, b = tuple(pair)
            if a in apart and b in apart:
                apart[a].add(b)
                apart[b].add(a)
        group: list[str] = []
        chosen: set[str] = set()
        for peer in sorted(live, key=lambda p: (len(apart[p.peer_id]), -p.samples, p.peer_id)):
            if not apart[peer.peer_id] & chosen:
                group.append(peer.peer_id)
                chosen.add(peer.peer_id)
        return sorted(group)

    @staticmethod
    def _shares(members: list[PeerState], group: list[str]) -> list[float]:
        """Equal parts, except that client-mode peers reduce nothing (unless all are)."""
        client = {p.peer_id for p in members if p.client_mode}
        if len(client) == len(group):
            return [1.0] * len(group)
        return [0.0 if peer in client else 1.0 for peer in group]

    @staticmethod
    def _pace(peer: PeerState, members: list[PeerState]) -> Pace:
        # A newcomer that has not reported yet still finishes the micro-batch under way;
        # the same task runs everywhere, so the others' micro-batch size is a fair guess.
        step = peer.micro_batch or max(p.micro_batch for p in members)
        return Pace(peer.samples, max(peer.pace, peer.throughput), step, peer.reported_at,
                    peer.compute_seconds, peer.accumulating_since, peer.best_throughput)

    def _resync(self, peer: PeerState, reason: str) -> list[Out]:
        peer.ready = False
        return [Send(peer.peer_id, Resync(self.epoch, reason))]

    def tick(self) -> list[Out]:
        """Deadlines: called about every quarter second."""
        rnd = self.round
        if rnd is not None and self._clock() > rnd.deadline + self.round_grace:
            return self._close_round(rnd)
        return self._maybe_open_round()

    # --- checkpoints and status ---------------------------------------------------------

    def expects_checkpoint(self, peer_id: str, epoch: int) -> bool:
        return (peer_id, epoch) in self._expected_checkpoints

    def checkpoint_stored(self, peer_id: str, info: CheckpointInfo) -> None:
        self._expected_checkpoints.discard((peer_id, info.epoch))
        if self.checkpoint is None or info.epoch >= self.checkpoint.epoch:
            self.checkpoint = info

    def status(self) -> Status:
        live = self.live_peers()
        samples = sum(p.samples for p in live)
        rate = sum(p.rate for p in live)
        missing = max(self.project.target_batch_size - samples, 0)
        eta = missing / rate if rate > 0 else None
        return Status(self.epoch, samples, self.project.target_batch_size, len(self.peers), rate, eta)
