"""Who is in a collaboration and what each peer has reported: liveness, pace, samples.

A sample count a peer reports is a claim, and counts only as far as the evidence here
bears it out: the time it has been accumulating, as this backbone timed it from when its
step was judged or its state accepted (nothing the peer can restart at will), times a pace
of at most MAX_PACE_RATIO times the typical member's (the median pace of the proven
members; one on probation: at most the typical pace), with TOLERANCE, a quarter second and
two micro-batches to spare. Everything downstream -- the tally that opens rounds, the progress bar, each
member's cap in a round, the ledger's bounds -- reads the counted figure."""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.backbone.ledger import TOLERANCE, Claim
from engine.backbone.tracker.standing import Identity, Standings
from engine.wire.control import Progress, SyncRequest
from engine.wire.types import MAX_COUNT, MAX_RATE, MAX_SECONDS

log = logging.getLogger(__name__)
PACE_DECAY = 0.9
BEST_DECAY = 0.995
# A pace is the samples a peer reported over the time since it began accumulating, timed
# over at least this long: two reports a microsecond apart say nothing of a machine.
MIN_PACE_WINDOW = 0.05
# A peer counts as at most this many times as fast as the typical member (a graphics card
# beside laptops), and as at most the typical one while on probation.
MAX_PACE_RATIO = 16.0
PROBATION_PACE_RATIO = 1.0
# A round member computes on after its last report until it takes its accumulator (the
# RoundStart on its way, the micro-batch under way): its cap allows this long more at its
# pace (its first pace of a run, timed from its start, may be low), beside two micro-batches.
UNREPORTED_SLACK = 0.25
# A member that dissents from the settled state, or misses a round, twice in a row is left
# out of rounds for this long, doubling with each further strike (up to an hour): a liar or
# a silent identity costs the others a round or two, not every round.
EXCLUSION = 30.0
MAX_EXCLUSION = 3600.0
# Progress reports between two counts of the live peers' samples only add what they report:
# summing a thousand peers on each of their reports cost the backbone a third of its time.
RECOUNT_INTERVAL = 0.1


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
    accumulating_since: float = 0.0  # when its step was judged or its state accepted, timed here
    compute_seconds: float = 0.0
    pace: float = 0.0  # samples/s since it began accumulating, timed here; carried across epochs
    claimed_too_much: int = -1  # the last epoch it claimed past the evidence (logged once an epoch)
    throughput: float = 0.0  # samples per second of compute, as it reports them
    best_throughput: float = 0.0
    micro_batch: int = 0  # smallest jump between two of its reports: one micro-batch
    answered: tuple[int, int] | None = None  # (epoch, samples) of the last report it asked on, answered
    serving: int = 0
    donor: str | None = None
    syncing_since: float | None = None
    paused: bool = False  # its owner needs the machine: not in rounds, not a donor
    sync_request: SyncRequest | None = None  # asked where to get the state, not answered yet
    client_mode: bool = False  # reachable only through a relay: sends parts, reduces none
    upload: float | None = None  # bytes per second its link achieves, as it reports them
    download: float | None = None
    strikes: int = 0  # rounds in a row it dissented from or missed
    # Its part reached the reducers of a settled round and its step agreed: its reports
    # count toward opening rounds, and rounds wait for it. Until then (and again after a
    # strike) it is on probation: in rounds, but never waited for.
    proven: bool = False
    accusers: set[str] = field(default_factory=set)  # joiners it served state that did not check out
    excluded_until: float = 0.0  # left out of rounds until then
    # Checkers could not get what it combined (a slow link, or it withholds it): its parts
    # cannot be checked, so until then it sends its gradient but reduces nothing.
    sends_only_until: float = 0.0
    unshown: int = 0  # times that happened
    # It let a check it was asked for lapse: until then nobody asks it to check (each check it
    # would hold a round for its whole time), doubling with each lapse.
    checks_nothing_until: float = 0.0
    lapsed: int = 0  # checks it let lapse
    # An auxiliary peer: no state, no gradient; it reduces parts of rounds. Proven once a
    # round it reduced a part of settled (until then it reduces only in trial rounds).
    auxiliary: bool = False


@dataclass
class Pace:
    """A round member's last report and speed, kept to judge its claim when the round ends,
    and its cap: the most samples its parts count for in the round (RoundStart.caps)."""

    samples: int
    rate: float
    micro_batch: int
    reported_at: float
    compute_seconds: float
    accumulating_since: float
    best_throughput: float
    cap: int = MAX_COUNT

    def claim(self, ended_at: float) -> Claim:
        # The first success needed every member's parts, so each member had stopped
        # accumulating by then: its unreported work fits before ``ended_at``.
        return Claim(self.samples, self.rate, self.micro_batch, ended_at - self.reported_at,
                     self.compute_seconds, ended_at - self.accumulating_since, self.best_throughput)


def probation_cap(peer: PeerState, micro_batch_guess: int) -> int:
    """An unproven member's cap beside proven ones: told its samples do not count yet, an
    honest one holds at a micro-batch, and brings what it reported and at most one more
    that was under way. (Held peers idle, so a cap by time would let a lie of ten times
    one micro-batch weigh.)"""
    step = peer.micro_batch or micro_batch_guess
    return peer.samples + step if peer.samples else 2 * step


class Members:
    def __init__(self, clock: Callable[[], float], peer_timeout: float) -> None:
        self.peers: dict[str, PeerState] = {}
        self.peer_timeout = peer_timeout
        self._clock = clock
        self._counted: dict[str, int] = {}  # samples per live peer as last counted, and reported since
        self._gathered = 0  # their sum
        self._counted_at = -math.inf
        self._typical = (0.0, 0)  # the typical member's pace and micro-batch (0: none measured yet)
        self._typical_at = -math.inf
        self.standings = Standings(clock)  # punishment, by identity: it outlives a socket
        self._bootstrap = True  # nobody is proven: everyone is judged as a proven member would be

    def join(self, peer_id: str, name: str, auxiliary: bool = False,
             identity: Identity | None = None) -> None:
        peer = self.peers[peer_id] = PeerState(peer_id, name, self._clock(), auxiliary=auxiliary)
        self.standings.arrived(peer, identity or Identity())

    def leave(self, peer_id: str) -> None:
        peer = self.peers.pop(peer_id, None)
        if peer is not None:
            self.standings.left(peer)

    def get(self, peer_id: str) -> PeerState | None:
        return self.peers.get(peer_id)

    def live(self, epoch: int) -> list[PeerState]:
        """Trainers in sync with ``epoch``, allowed to compute, heard from lately, and not
        excluded."""
        now = self._clock()
        return [
            p for p in self.peers.values()
            if p.ready and not p.paused and p.epoch == epoch and now - p.heard_at <= self.peer_timeout
            and p.excluded_until <= now and not p.auxiliary
        ]

    def counted(self, epoch: int) -> list[PeerState]:
        """The live peers whose samples count toward the target: until some peer has proven
        itself (a fresh collaboration, a restarted backbone), everyone's word counts."""
        live = self.live(epoch)
        return [p for p in live if p.proven] or live

    def auxiliaries(self) -> list[PeerState]:
        """Auxiliary peers heard from lately, not paused and not excluded, by id."""
        now = self._clock()
        return sorted((p for p in self.peers.values()
                       if p.auxiliary and not p.paused and now - p.heard_at <= self.peer_timeout
                       and p.excluded_until <= now), key=lambda p: p.peer_id)

    def strike(self, peer: PeerState, why: str) -> None:
        """It dissented from the settled state or missed a round: twice in a row, and it sits
        rounds out for a growing time."""
        peer.strikes += 1
        peer.proven = False
        if peer.strikes >= 2:
            pause = min(EXCLUSION * 2 ** (peer.strikes - 2), MAX_EXCLUSION)
            peer.excluded_until = self._clock() + pause
            log.warning("leaving %s out of rounds for %.0f s: %s (%d in a row)", peer.peer_id, pause, why,
                        peer.strikes)

    def reduce_nothing(self, peer: PeerState, why: str) -> None:
        """Its parts could not be checked: it keeps training, as a peer that cannot take
        inbound traffic does, and reduces no part for a time that doubles each time."""
        peer.unshown += 1
        pause = min(EXCLUSION * 2 ** (peer.unshown - 1), MAX_EXCLUSION)
        peer.sends_only_until = self._clock() + pause
        log.warning("%s reduces no part for %.0f s: %s (%d times)", peer.peer_id, pause, why, peer.unshown)

    def check_nothing(self, peer: PeerState) -> None:
        """It let a check lapse: it is not asked to check for a time that doubles each time."""
        peer.lapsed += 1
        pause = min(EXCLUSION * 2 ** (peer.lapsed - 1), MAX_EXCLUSION)
        peer.checks_nothing_until = self._clock() + pause
        log.warning("%s is asked to check nothing for %.0f s: it let a check lapse (%d times)", peer.peer_id,
                    pause, peer.lapsed)

    def sends_only(self) -> set[str]:
        """Peers that reduce no part now: those reachable only through a relay, and those
        whose parts checkers could not get lately."""
        now = self._clock()
        return {p.peer_id for p in self.peers.values() if p.client_mode or p.sends_only_until > now}

    def expel(self, peer: PeerState, why: str) -> None:
        """It was caught doing harm on purpose: out of rounds for as long as anyone is."""
        peer.strikes += 1
        peer.proven = False
        peer.excluded_until = self._clock() + MAX_EXCLUSION
        self.standings.expelled(peer)
        log.warning("leaving %s out of rounds for %.0f s: %s", peer.peer_id, MAX_EXCLUSION, why)

    def report(self, peer: PeerState, msg: Progress, now: float) -> None:
        """Take in a progress report of the current epoch: its samples, as far as the evidence
        bears them out, and how fast it goes."""
        samples = min(msg.samples, self.sample_bound(peer, now))
        if samples < msg.samples and peer.claimed_too_much != peer.epoch:
            peer.claimed_too_much = peer.epoch
            log.warning("counting %d of the %d samples %s claims at epoch %d: more than its time allows",
                        samples, msg.samples, peer.peer_id, peer.epoch)
        step = samples - peer.samples
        if step > 0:
            peer.micro_batch = min(peer.micro_batch or step, step)
        elapsed = now - peer.accumulating_since
        if samples > 0 and elapsed >= MIN_PACE_WINDOW:
            peer.pace = max(peer.pace * PACE_DECAY, samples / elapsed)
        if msg.compute_seconds > 0:
            peer.throughput = max(peer.throughput * PACE_DECAY, samples / msg.compute_seconds)
            peer.best_throughput = max(peer.best_throughput * BEST_DECAY, samples / msg.compute_seconds)
        peer.samples, peer.loss = samples, msg.loss
        peer.rate = min(msg.samples_per_second, self.rate_bound(peer))
        peer.compute_seconds = msg.compute_seconds
        self._links(peer, msg)
        peer.heard_at = now
        if step != 0:
            peer.reported_at = now

    def typical(self) -> tuple[float, int]:
        """The typical member's pace and micro-batch: the medians (the upper middle) of the
        proven live trainers' -- of everyone's while nobody is proven. Identities that hold
        no state are never proven, so they cannot move it; one proven stranger among two or
        more honest members cannot either; and a slow device (a laptop beside workstations,
        a machine its owner is using) cannot drag it down for the others."""
        now = self._clock()
        if now - self._typical_at >= RECOUNT_INTERVAL:
            self._typical_at = now
            trainers = [p for p in self.peers.values() if p.ready and not p.auxiliary and p.pace > 0
                        and now - p.heard_at <= self.peer_timeout and p.excluded_until <= now]
            measured = [p for p in trainers if p.proven] or trainers
            self._bootstrap = not any(p.proven for p in trainers)
            self._typical = ((statistics.median_high(p.pace for p in measured),
                              statistics.median_high(p.micro_batch for p in measured))
                             if measured else (0.0, 0))
        return self._typical

    def rate_bound(self, peer: PeerState) -> float:
        """The fastest pace ``peer`` counts as having (infinite before anyone's is measured)."""
        pace, _ = self.typical()
        if pace <= 0:
            return math.inf
        return pace * (MAX_PACE_RATIO if peer.proven or self._bootstrap else PROBATION_PACE_RATIO)

    def sample_bound(self, peer: PeerState, now: float) -> int:
        """The most samples ``peer`` may have accumulated by ``now``."""
        rate, (_, micro_batch) = self.rate_bound(peer), self.typical()
        if math.isinf(rate):
            return MAX_COUNT
        elapsed = max(now - peer.accumulating_since, 0.0) + UNREPORTED_SLACK  # (messages wait in queues)
        return min(math.ceil(TOLERANCE * rate * elapsed) + 2 * micro_batch, MAX_COUNT)

    def cap(self, peer: PeerState, now: float, micro_batch_guess: int = 0, pace_floor: float = 0.0) -> int:
        """The most samples a round opened ``now`` counts from ``peer``: what its time allows,
        and what it reported plus what its pace adds since, with two micro-batches to spare
        (one finished since its report, one under way). Before anyone's pace is measured, a
        member that has not reported yet gets two of ``micro_batch_guess`` (the others'):
        its first report may still be on its way. Its pace counts as at least ``pace_floor``
        (the round's typical member's): a first pace timed over the warm-up says little, and
        the floor gives nobody more than reporting faster could (paces are claims too)."""
        rate, (_, micro_batch) = self.rate_bound(peer), self.typical()
        pace = min(max(peer.pace, peer.throughput, pace_floor), rate)
        own = (peer.micro_batch or micro_batch_guess) if math.isinf(rate) else 0
        slack = 2 * max(micro_batch, own)
        unreported = max(now - peer.reported_at, 0.0) + UNREPORTED_SLACK
        reported = TOLERANCE * (peer.samples + pace * unreported) + slack
        return min(self.sample_bound(peer, now), math.ceil(reported), MAX_COUNT)

    def paces(self, members: list[PeerState], now: float) -> dict[str, Pace]:
        """The members' evidence when a round opens ``now``, to judge their claims when it
        ends. A newcomer that has not reported yet still finishes the micro-batch under way:
        the same task runs everywhere, so the others' micro-batch size is a fair guess, and
        their pace too: the floor is the median of the paces measured, not one pulled to
        zero by members whose first report is on its way."""
        guess = max(p.micro_batch for p in members)
        measured = [pace for p in members if (pace := max(p.pace, p.throughput)) > 0]
        floor = statistics.median_high(measured) if measured else 0.0
        paces = {p.peer_id: self.pace(p, now, guess, floor) for p in members}
        if any(p.proven for p in members):
            for p in members:
                if not p.proven:
                    paces[p.peer_id].cap = min(paces[p.peer_id].cap, probation_cap(p, guess))
        return paces

    def pace(self, peer: PeerState, now: float, micro_batch_guess: int = 0, pace_floor: float = 0.0) -> Pace:
        """``peer``'s evidence now (see ``paces`` and ``cap``)."""
        step = peer.micro_batch or micro_batch_guess
        rate = self.rate_bound(peer)
        return Pace(peer.samples, min(max(peer.pace, peer.throughput), rate), step, peer.reported_at,
                    peer.compute_seconds, peer.accumulating_since, min(peer.best_throughput, rate),
                    self.cap(peer, now, step, pace_floor))

    def report_link(self, peer: PeerState, msg: Progress, now: float) -> None:
        """An auxiliary peer's report: it is alive, and what its link achieves. Its samples
        are nobody's (it computes none)."""
        self._links(peer, msg)
        peer.heard_at = now

    @staticmethod
    def _links(peer: PeerState, msg: Progress) -> None:
        if msg.client_mode != peer.client_mode:
            log.info("%s %s", peer.peer_id, "reaches the others through a relay only: it reduces nothing"
                     if msg.client_mode else "is reachable directly again")
        peer.client_mode = msg.client_mode
        peer.upload, peer.download = msg.upload or peer.upload, msg.download or peer.download

    def may_reach(self, target: int, peer: PeerState, epoch: int, now: float) -> bool:
        """A cheap first test for the hot path: False only if the live peers' samples fall
        short of ``target``. Between counts the tally can overshoot (peers that went quiet),
        which merely runs the full test; it can miss samples that count again without a
        report (a peer resuming), which ``tick`` picks up within a quarter second."""
        if now - self._counted_at >= RECOUNT_INTERVAL:
            self._counted = {p.peer_id: p.samples for p in self.live(epoch)}
            self._gathered = sum(self._counted.values())
            self._counted_at = now
        else:
            self._gathered += peer.samples - self._counted.get(peer.peer_id, 0)
            self._counted[peer.peer_id] = peer.samples
        return self._gathered >= target

    def restart_accumulation(self, peer: PeerState, since: float | None = None) -> None:
        """It starts from zero samples: since ``since`` (when its report that it did arrived),
        or now. Zero is what it held then, not now: a step judged late (the last voter slow
        to answer) must not hide the samples it computed meanwhile from its cap."""
        now = self._clock()
        peer.samples, peer.compute_seconds = 0, 0.0
        peer.accumulating_since = peer.reported_at = min(since, now) if since is not None else now
        peer.heard_at = now


def unreported(peers: list[PeerState], now: float) -> tuple[float, float]:
    """The peers' pace (timed here, of samples the evidence bears out; the rate they claim
    until measured) and how old their counts are, weighted by it: the two multiplied are
    about what they computed since they reported. (Their claimed rates are over wall time,
    rounds and holds included: digits' peers computed 1,240 samples/s and claimed 470.)"""
    paces = [(p.pace or p.rate, max(now - p.reported_at, 0.0)) for p in peers]
    pace = math.fsum(v for v, _ in paces)
    if pace <= 0:
        return 0.0, 0.0
    return min(pace, MAX_RATE), min(math.fsum(v * age for v, age in paces) / pace, MAX_SECONDS)
