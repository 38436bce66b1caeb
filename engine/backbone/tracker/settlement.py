"""How a round ends: never on one member's word. Every member reports the hash of the state
its step produced; the round settles on the hash a strict majority of the voters that
count hold (voters: the members not on probation; those that count: the voters that
answered, and those still connected who may yet answer -- a member that reports failure
counts too: it may have failed because the one reporting success withheld its result).
Then the epoch advances, members that dissent resync (twice in a row, and they sit rounds
out), and once every voter has answered, each member is credited with what a majority of
reducers saw it send; one the reducers did not see is struck. A round that does not
settle is discarded: its members go back to the last settled state, which they kept.

Auxiliary members take no step and never vote: a round they reduced in that settles
proves them and credits the bytes they aggregated; their silence strikes them.

A round that does not settle while most of the other voters still waited for a reducer's
results strikes that reducer, unless it names whose part it missed (those pairs are kept
apart instead): a reducer that takes the parts and withholds its results sits rounds out
after its second time, like any peer struck twice."""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from engine.averaging.seen import seen_by_reducers
from engine.backbone.ledger import Credit, bytes_aggregated, credits
from engine.backbone.tracker.grouped_parts import grouped_bytes_reduced
from engine.backbone.tracker.membership import PeerState
from engine.backbone.tracker.outputs import Broadcast, Out, RecordCredits, RecordStep
from engine.backbone.tracker.scheduling import OpenRound, Vote, vote
from engine.evaluators import evaluators
from engine.planning.sizes import encoded_size
from engine.project import codec_of
from engine.wire.control import AuditDone, RoundDone, Step

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.backbone.tracker.checkpoint_requests import CheckpointRequests
    from engine.backbone.tracker.checks import Auditor
    from engine.backbone.tracker.heldout import HeldOutScores
    from engine.backbone.tracker.membership import Members, PeerState
    from engine.backbone.tracker.outputs import Out
    from engine.backbone.tracker.pairs import Pairs
    from engine.backbone.tracker.scheduling import OpenRound, Scheduler
    from engine.backbone.tracker.syncing import StateSources
    from engine.project import ProjectSpec

log = logging.getLogger(__name__)
# After a round settles, how long it stays open for its auxiliary members' reports (what
# credits their parts): an honest one reports before the trainers have applied the step.
# A round that does not settle waits for them until its deadline: an auxiliary peer gives
# up at AUXILIARY_DEADLINE of the round's timeout (wire/control.py), naming whose parts it
# missed, before the trainers give up on its results.
REPORT_GRACE = 2.0


class SettlingTracker(Protocol):
    """What settling a round needs of the tracker."""

    project: ProjectSpec
    clock: Callable[[], float]
    members: Members
    pairs: Pairs
    scheduler: Scheduler
    sources: StateSources
    audits: Auditor
    heldout: HeldOutScores
    round: OpenRound | None
    epoch: int
    state_sha256: str | None
    checkpoint_requests: CheckpointRequests

    def resync(self, peer: PeerState, reason: str) -> list[Out]: ...


class Settlement:
    def __init__(self, tracker: SettlingTracker) -> None:
        self.t = tracker
        self.closed: OpenRound | None = None  # the last round closed: its optional members may report late

    def round_done(self, peer: PeerState, msg: RoundDone) -> list[Out]:
        t = self.t
        rnd = t.round
        if rnd is None or msg.round_id != rnd.round_id:
            return self._late(peer, msg)  # a round long closed: what it settled on stands
        if peer.peer_id not in rnd.group or peer.peer_id in rnd.outcomes:
            return []
        rnd.outcomes[peer.peer_id] = msg
        rnd.answered_at[peer.peer_id] = t.clock()
        if msg.ok and rnd.first_success_at is None and peer.peer_id in rnd.voters:
            rnd.first_success_at = t.clock()
        out: list[Out] = []
        if rnd.settled_to is None:
            out += self._try_settle(rnd, final=False)
        else:
            out += self._judge(rnd, peer, msg)
        if not msg.ok:
            for other in msg.unreachable:
                if other in rnd.group and other != peer.peer_id:
                    t.pairs.keep_apart(peer.peer_id, other)
        return out + t.sources.answer_waiting(patient=True) + self.close_if_answered()

    def abandoned(self, peer: PeerState) -> list[Out]:
        """A member asked for the state mid-round: it will not report a step."""
        rnd = self.t.round
        if rnd is None or peer.peer_id not in rnd.group or peer.peer_id in rnd.outcomes:
            return []
        return self.round_done(peer, RoundDone(rnd.round_id, rnd.epoch, ok=False, error="it resynced"))

    def _late(self, peer: PeerState, msg: RoundDone) -> list[Out]:
        """An optional member's outcome after its round closed (nobody waited for it)."""
        rnd, t = self.closed, self.t
        if (rnd is None or msg.round_id != rnd.round_id or peer.peer_id not in rnd.optional
                or peer.peer_id in rnd.outcomes):
            return []
        rnd.outcomes[peer.peer_id] = msg
        if rnd.settled_to is not None and t.epoch == rnd.epoch + 1 and t.state_sha256 == rnd.settled_to:
            if rnd.holds_settled(msg) and peer.peer_id in rnd.unproven:
                peer.proven = True  # the reducers saw its samples, and now its step agrees
            return self._judge(rnd, peer, msg)
        return t.resync(peer, "the round did not settle") if msg.ok else []

    def _try_settle(self, rnd: OpenRound, final: bool) -> list[Out]:
        """Settle on the hash a strict majority of the voters that count reported. Before
        the deadline, voters still connected count (they may yet report); at the deadline,
        only those that answered -- except in a round replayed after a restart, where every
        voter counts: the first to reconnect must not decide it alone."""
        voters = rnd.voters
        votes = Counter(v for p, o in rnd.outcomes.items() if p in voters and (v := vote(o)) is not None)
        if not votes:
            return []
        counted = {p for p in voters if p in rnd.outcomes}  # a failure counts: it may be a victim's
        if rnd.recovering:
            counted = set(voters)
        elif not final:
            counted |= {m for m in voters if m in self.t.members.peers}
        majority, held = votes.most_common(1)[0]
        if held * 2 <= len(counted):
            return []
        return self._verified(rnd, majority)

    def _verified(self, rnd: OpenRound, majority: Vote) -> list[Out]:
        """Settle now -- or, if parts were drawn for checking (backbone/tracker/checks.py),
        once they check out."""
        audits = self.t.audits
        if rnd.audit is None:
            rnd.audit = audits.draw(rnd, majority)
        out = audits.advance(rnd)
        return out + self._settle(rnd, majority) if rnd.audit.passed else out

    def audit_done(self, peer: PeerState, msg: AuditDone) -> list[Out]:
        rnd = self.t.round
        if rnd is None or rnd.round_id != msg.round_id or rnd.audit is None or rnd.settled_to is not None:
            if self.closed is not None and self.closed.round_id == msg.round_id:  # (others: nobody asked)
                log.info("%s: %s's verdict on part %d of round %d came after the round ended",
                         self.t.project.id, peer.peer_id, msg.index, msg.round_id)
            return []
        return self.audited(rnd, self.t.audits.done(rnd, msg, peer.peer_id))

    def audited(self, rnd: OpenRound, out: list[Out]) -> list[Out]:
        """After a check's progress: settle the round, discard it, or wait on."""
        audit = rnd.audit
        if audit is None or rnd.settled_to is not None:
            return out
        if audit.failed:
            return out + self.close(rnd)
        if audit.passed:
            return out + self._settle(rnd, audit.majority) + self.close_if_answered()
        return out

    def _settle(self, rnd: OpenRound, majority: Vote) -> list[Out]:
        t = self.t
        voters = rnd.voters
        digest = majority[0]
        rnd.settled_to, rnd.settled_vote, rnd.settled_at = digest, majority, t.clock()
        holders = [o for p, o in rnd.outcomes.items() if p in voters and rnd.holds_settled(o)]
        losses = [o.loss for o in holders if o.loss is not None]
        t.epoch, t.state_sha256 = rnd.epoch + 1, digest
        # What rounds move (every phase's vector): the LP's time per byte times this is a round's.
        lengths = [sum(o.phase_numel) if o.phase_numel else o.numel for o in holders if o.numel > 0]
        if lengths:
            t.scheduler.vector_bytes = encoded_size(statistics.median_low(lengths),
                                                    codec_of(t.project.compression))
        step = Step(epoch=t.epoch, round_id=rnd.round_id, loss=statistics.median(losses) if losses else None,
                    samples=int(statistics.median_low(o.samples for o in holders)), peers=len(rnd.group),
                    round_seconds=round(t.clock() - rnd.opened_at, 3), state_sha256=digest)
        log.info("%s: round %d settled epoch %d (%d of %d voters agree)", t.project.id, rnd.round_id,
                 t.epoch, len(holders), len(rnd.voters))
        out: list[Out] = [RecordStep(step), Broadcast(step)]
        trainers = [p for p in rnd.group if p not in rnd.auxiliary]
        t.heldout.settled(step.epoch, digest, evaluators(trainers, step.epoch, t.project.evaluate_every))
        if rnd.checkpoint_by is not None and not rnd.recovering:
            t.checkpoint_requests.ask(rnd.checkpoint_by, t.epoch)
        t.pairs.exchanged(p for p, o in rnd.outcomes.items() if rnd.holds_settled(o))
        for member, outcome in rnd.outcomes.items():
            peer = t.members.get(member)
            if peer is not None:
                out += self._judge(rnd, peer, outcome)
        for p in t.members.peers.values():
            # A paused peer is told when it resumes: downloading the state now would take
            # the machine its owner asked back.
            if p.ready and not p.paused and p.peer_id not in rnd.group:
                out += t.resync(p, "an epoch finished while you were not in the round")
        for aux in rnd.auxiliary_reducers():
            peer = t.members.get(aux)
            if peer is not None:  # the voters applied its results: they agree
                peer.proven, peer.strikes = True, 0
        t.audits.settled(rnd)
        return out

    def _judge(self, rnd: OpenRound, peer: PeerState, msg: RoundDone) -> list[Out]:
        """A member's outcome against the settled state (an auxiliary member holds none)."""
        t = self.t
        if peer.peer_id in rnd.auxiliary:
            return []
        if rnd.holds_settled(msg):
            peer.ready, peer.epoch, peer.strikes = True, t.epoch, 0
            # It went on computing once it took its step (overlapped: once it took its
            # gradient, when the round opened): its time counts from then.
            since = rnd.opened_at if t.project.overlap else rnd.answered_at.get(peer.peer_id)
            t.members.restart_accumulation(peer, since)
            return []
        if msg.ok:
            log.error("%s: peer %s dissented in round %d", t.project.id, peer.peer_id, rnd.round_id)
            t.members.strike(peer, "its state differed from the collaboration's")
            return t.resync(peer, "your step differs from the collaboration's")
        return t.resync(peer, "the round finished without you")

    def close_if_answered(self) -> list[Out]:
        """Close the open round once every voter still here has answered -- or, in a round
        replayed after a restart and not yet settled, every voter: the others are still
        reconnecting, and the first back must not decide it alone."""
        rnd = self.t.round
        if rnd is None:
            return []
        waited = set(self.t.members.peers)
        if rnd.recovering and rnd.settled_to is None:
            waited |= set(rnd.voters)
        checking = rnd.audit is not None and not (rnd.audit.passed or rnd.audit.failed)
        if checking or not rnd.answered(waited, auxiliary=self.t.clock() <= self.reports_due(rnd)):
            return []
        return self.close(rnd)

    @staticmethod
    def reports_due(rnd: OpenRound) -> float:
        """Until when the round waits for its auxiliary members' reports."""
        return rnd.deadline if rnd.settled_to is None else rnd.settled_at + REPORT_GRACE

    def close(self, rnd: OpenRound) -> list[Out]:
        t = self.t
        t.round, self.closed = None, rnd
        t.scheduler.round_over(rnd)
        out: list[Out] = []
        if rnd.settled_to is None and not (rnd.audit is not None and rnd.audit.failed):
            out += self._try_settle(rnd, final=True)
        out += t.sources.answer_waiting(patient=False)
        out += t.audits.withdrawals
        t.audits.withdrawals = []
        if rnd.settled_to is None:
            why = "the round did not settle"
            if rnd.audit is not None and rnd.audit.failed:
                why = "a part of the round did not check out: " + "; ".join(
                    p.why for p in rnd.audit.parts if p.passed is False)[:500]
            log.warning("%s: round %d for epoch %d discarded: %s", t.project.id, rnd.round_id, rnd.epoch, why)
            t.scheduler.retry_later()
            for member, outcome in rnd.outcomes.items():
                peer = t.members.get(member)
                if peer is not None and outcome.ok:  # it took a step that did not settle: undo it
                    out += t.resync(peer, why)
        elif not rnd.recovering:
            out.append(RecordCredits(rnd.round_id, self._credit(rnd)))
        for pid in rnd.voters:
            peer = t.members.get(pid)
            if peer is not None and pid not in rnd.outcomes:
                if not rnd.recovering:  # (after a restart, it may have been away reconnecting)
                    t.members.strike(peer, "it did not finish a round")
                out += t.resync(peer, "you did not finish the round in time")
        if not rnd.recovering:
            weights = rnd.weights()
            for reducer in [p for p in rnd.group if weights[p] > 0 and p not in rnd.lost]:
                peer = t.members.get(reducer)
                why = self._withheld(rnd, reducer)
                if peer is not None and why:
                    t.members.strike(peer, why)
        return out

    def _withheld(self, rnd: OpenRound, reducer: str) -> str:
        """Why the round's end is this reducer's fault, if it is: an auxiliary one stayed
        silent past ``reports_due``; or the round did not settle while at least two, and
        most, of the other voters were still waiting for its results, and it named nobody
        whose part it missed."""
        outcome = rnd.outcomes.get(reducer)
        if outcome is None:
            silent = reducer in rnd.auxiliary and self.t.clock() > self.reports_due(rnd)
            return "it did not report on a round it reduced in" if silent else ""
        if rnd.settled_to is not None or outcome.unreachable:
            return ""  # (the pairs it names are kept apart instead)
        others = [p for p in rnd.voters if p != reducer]
        waiting = sum(reducer in o.waiting for p, o in rnd.outcomes.items() if p in others)
        return "the others still waited for its results" if waiting >= 2 and waiting * 2 > len(others) else ""

    def _credit(self, rnd: OpenRound) -> dict:
        """What a majority of reducers saw each member send, capped by its measured pace;
        nothing for a member lost midway. A member whose part they did not see is struck (a
        silent stranger sits rounds out soon); one they saw with samples, whose step agreed,
        has proven itself, once its step agrees."""
        reports = {member: outcome.received for member, outcome in rnd.outcomes.items()}
        # Reducers that never reported (an auxiliary member silent past its grace) vouch for
        # nobody and against nobody: the others decide, and a sender they did not see is
        # struck only if they hold most of the vector.
        # In a grouped round a member's parts go to its group's reducers only: they decide.
        seen: dict[str, int] = {}
        conclusive: set[str] = set()  # the senders whose reducers hold most of their weight
        for senders, weights in rnd.reducer_groups():
            reported = {r: w for r, w in weights.items() if r in rnd.outcomes}
            if sum(reported.values()) * 2 > sum(weights.values()):
                conclusive |= senders
            seen |= {p: n for p, n in seen_by_reducers(reports, reported).items()
                     if p in senders and p not in rnd.lost}
        for pid in rnd.group:
            peer = self.t.members.get(pid)
            if peer is None or pid in rnd.auxiliary:  # (it sends no part)
                continue
            if pid not in seen:
                # (a silent voter: below)
                if pid in conclusive and (pid in rnd.optional or pid in rnd.outcomes):
                    self.t.members.strike(peer, "the reducers did not get its part")
            elif seen[pid] > 0 and peer.strikes == 0:
                # Proven once its step agrees too: sending parts is not taking part. (An
                # optional member's outcome may come after the round closed: see _late.)
                outcome = rnd.outcomes.get(pid)
                if outcome is None:
                    rnd.unproven.add(pid)
                elif rnd.holds_settled(outcome):
                    peer.proven = True
        ended = rnd.first_success_at if rnd.first_success_at is not None else rnd.settled_at
        computed = credits(seen, {p: m.claim(ended) for p, m in rnd.members.items()})
        return computed | self._aggregated(rnd, seen)

    def _aggregated(self, rnd: OpenRound, seen: dict[str, int]) -> dict[str, Credit]:
        """Each auxiliary reducer's credit: the bytes of the parts it reduced, from each
        sender the reducers saw bring samples. The vector's length is what the voters that
        hold the settled state say it is."""
        said = rnd.phase_lengths(rnd.settled_vote) if rnd.settled_vote is not None else []
        if not said:
            return {}
        # (the median per phase: a liar inflates no credit)
        lengths = [statistics.median_low(lengths[k] for lengths in said) for k in range(rnd.phases)]
        sizes = rnd.wire_sizes(lengths)
        codec = codec_of(self.t.project.compression)
        out = {}
        for aux in rnd.auxiliary_reducers():
            outcome = rnd.outcomes.get(aux)
            if outcome is None or not outcome.ok:
                continue
            if rnd.groups is not None:
                aggregated = grouped_bytes_reduced(rnd, aux, lengths, outcome.received, seen, codec)
            else:
                senders = sum(1 for s in outcome.received if seen.get(s, 0) > 0)
                parts = [size for j, size in enumerate(sizes) if rnd.reducer_of(j) == aux]
                aggregated = bytes_aggregated(parts, senders, codec)
            if aggregated > 0:
                out[aux] = Credit(0, 0.0, aggregated)
        return out
