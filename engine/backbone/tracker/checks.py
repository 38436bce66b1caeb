"""Checking reducers (the peers' half: engine/averaging/recheck.py, engine/peer/checking.py).

Once a round has a majority state, the backbone draws each reducer's part with the
project's ``verify_probability``. Every member committed to what it did in its
``round_done`` before the draw, so a reducer learns it is checked only when it can no
longer choose what it combined. A drawn part is rechecked by another member that holds
the majority state (the reducer sends it its inputs and result), and the round settles
only once every drawn part checks out. The verdicts:

- the first checker agrees: the part passes;
- it disagrees: a second checker is asked, and a third if they split; two verdicts alike
  decide, and a checker on the other side is expelled (a lying checker costs itself); an
  even split with nobody left to ask (a round of three voters) passes the part and expels
  the checkers against it: a wrong result has every honest checker against it, so only a
  dishonest majority of those voters could split on it; one verdict against and no other
  voter to ask (two voters, a newcomer on probation beside them) discards the round and
  keeps the two apart for a while: rounds go on without one of them, and prove the
  newcomer, who can decide the next dispute;
- two checkers find the result wrong: the reducer is expelled, and the round is discarded
  on every member (each goes back to the state it kept and takes its gradient to the next
  round, so the part is redone); so is a reducer that combined another part of its own
  than it showed the senders before taking theirs (a majority of them say what they were
  shown); and it loses the credit of every round it reduced since its last part that
  passed a check (the ledger withdraws it);
- a checker got no inputs (the reducer's link is slow, or it withholds them): that is no
  verdict, and another checker is asked; if UNANSWERED checkers got none, the round is
  discarded and the reducer reduces no part for a time that doubles each time (it is not
  expelled: an honest one may sit behind a slow link, and keeps training);
- no decision (the reducer never committed, checkers ran out): the round is discarded,
  nobody expelled -- an unverifiable step is never kept.

A checker waits for the inputs a few times as long as the round took (CHECK_TIME_FACTOR),
and has as long again to answer: a silent one is struck and replaced in seconds, not
minutes. A sender whose committed part differs from what the reducer says it received may
be lying, or the reducer may be: the two are kept apart, as peers that cannot exchange are.
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from typing import TYPE_CHECKING, Protocol

from msgspec.structs import replace

from engine.backbone.tracker import grouped_parts as grouped
from engine.backbone.tracker.outputs import Out, Send, WithdrawCredits
from engine.backbone.tracker.part_checks import PartCheck, RoundAudit
from engine.backbone.tracker.scheduling import OpenRound, Vote, vote
from engine.wire.commitments import EMPTY_PART, Committed
from engine.wire.control import Audit, AuditDone, RoundDone

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.backbone.tracker.membership import Members
    from engine.backbone.tracker.pairs import Pairs
    from engine.project import ProjectSpec

log = logging.getLogger(__name__)
# Checkers a reducer may leave without its inputs before its part counts as not shown.
UNANSWERED = 2
# The settled rounds a reducer reduced in since a part of it last passed a check, kept up to
# this many (their credit is withdrawn if it is caught).
MAX_UNCHECKED = 10_000
# A checker waits for a reducer's inputs this many times as long as the round took so far,
# at least MIN_CHECK_TIME, at most the round's timeout; then has as long again to answer.
CHECK_TIME_FACTOR = 4
MIN_CHECK_TIME = 5.0


class AuditedTracker(Protocol):
    """What checking reducers needs of the tracker."""

    clock: Callable[[], float]
    members: Members
    pairs: Pairs
    project: ProjectSpec
    round: OpenRound | None


class Auditor:
    def __init__(self, tracker: AuditedTracker, rng: random.Random | None = None) -> None:
        self.t = tracker
        self.rng = rng or random.SystemRandom()
        self.drawn = 0
        self.caught = 0
        self.unchecked: dict[str, list[int]] = {}  # reducer -> rounds it reduced in since its last check
        self.withdrawals: list[WithdrawCredits] = []  # for the round's close to carry out

    def settled(self, rnd: OpenRound) -> None:
        """A round settled: its reducers' credit stands until one of them is caught, unless
        a part it reduced passed a check now."""
        if self.t.project.aggregation.verify_probability <= 0 or rnd.recovering:
            return
        vetted = {p.reducer for p in rnd.audit.parts if p.passed} if rnd.audit is not None else set()
        for reducer, weight in rnd.weights().items():
            if weight <= 0 or reducer in rnd.lost:
                continue
            if reducer in vetted:
                self.unchecked.pop(reducer, None)
            else:
                rounds = self.unchecked.setdefault(reducer, [])
                rounds.append(rnd.round_id)
                del rounds[:-MAX_UNCHECKED]

    def draw(self, rnd: OpenRound, majority: Vote) -> RoundAudit:
        p = self.t.project.aggregation.verify_probability
        parts = []
        if p > 0 and not rnd.recovering and len(rnd.voters) > 1:
            # The longest length a holder reports, per phase: a liar can only add parts to
            # the draw, never hide one from it (holders of one state hold one model: one
            # length). Each part of each phase is drawn alone: a reducer that lies in one
            # phase only is caught as often as one that lies in both.
            said = rnd.phase_lengths(majority)
            if rnd.groups is not None:  # (each level of each group, each part drawn alone)
                lengths = [max(reported[k] for reported in said) if said else 10**9
                           for k in range(rnd.phases)]
                parts = [PartCheck(part.index, part.reducer)
                         for part in grouped.grouped_parts(rnd.groups, lengths, rnd.slot_reducers())
                         if part.size > 0 and self.rng.random() < p]
            else:
                indices = range(rnd.phases * rnd.parts)
                sizes = (rnd.wire_sizes([max(lengths[k] for lengths in said) for k in range(rnd.phases)])
                         if said else [1] * len(indices))
                parts = [PartCheck(j, rnd.reducer_of(j)) for j in indices
                         if rnd.share_of(j) > 0 and sizes[j] > 0 and self.rng.random() < p]
        self.drawn += len(parts)
        return RoundAudit(majority, parts)

    def advance(self, rnd: OpenRound) -> list[Out]:
        """Start the checks whose reducer has committed (it answered the round)."""
        audit = rnd.audit
        assert audit is not None
        out: list[Out] = []
        for part in audit.parts:
            if part.audit is None and part.passed is None and part.reducer in rnd.outcomes:
                out += self._start(rnd, audit, part)
        return out

    def _start(self, rnd: OpenRound, audit: RoundAudit, part: PartCheck) -> list[Out]:
        done = rnd.outcomes[part.reducer]
        commitment = done.commitment
        inputs = commitment.inputs_of(part.index) if commitment is not None else None
        holds_state = part.reducer in rnd.auxiliary or vote(done) == audit.majority
        if rnd.groups is None:
            first = rnd.group[part.index % rnd.parts // rnd.pieces]
            combined_by_first = part.index < (rnd.phases - 1) * rnd.parts
        else:
            first, combined_by_first = grouped.first_combiner(rnd, part.index, part.reducer)
        if inputs is None and first in rnd.lost and combined_by_first:
            # Its backup took over a later phase only: the lost reducer combined this part,
            # and nobody can show what it combined. Kept unchecked, it would let a liar lie,
            # then leave; the round is redone instead, at no one's cost.
            part.passed = False
            part.why = f"its reducer {first} left the round after combining it: nobody can show its inputs"
            return []
        if not done.ok or inputs is None or not holds_state:
            why = (f"its round failed ({done.error})" if not done.ok else "it names no inputs for the part"
                   if inputs is None else "its state is not the majority's")
            part.passed = False
            part.why = f"its reducer {part.reducer} did not commit to what it combined: {why}"
            return []
        place = None if rnd.groups is None else grouped.place_of(rnd.groups, rnd.phases, part.index,
                                                                  rnd.slot_reducers())
        holders = _holders(rnd, audit.majority)
        if place is not None and place.level == 1:
            # The group's average: its reducer alone holds it, and sent it on (``forwarded``).
            applied = Counter(result for result in [_applied(rnd, part.reducer, part.index)] if result)
        else:
            applied = Counter(result for p in holders if (result := _applied(rnd, p, part.index)))
        if not applied:
            part.passed, part.why = False, "nobody committed to the result it applied"
            return []
        shown = self._own_as_shown(rnd, part, inputs)
        if not shown:
            return []  # failed, or undecided until the other senders report
        self._compare_sent(rnd, part, inputs)
        result = applied.most_common(1)[0][0]
        caps = {p: m.cap for p, m in rnd.members.items()}
        if place is not None and place.level == 2:
            caps = grouped.level_two_caps_of(rnd, caps)
        part.audit = Audit(round_id=rnd.round_id, epoch=rnd.epoch, index=part.index, reducer=part.reducer,
                           checker="-", inputs=inputs, result_sha256=result, timeout=self._check_time(rnd),
                           caps=[caps.get(c.sender, 0) for c in inputs])
        if place is not None:
            assert rnd.groups is not None
            part.audit = grouped.grouped_audit(part.audit, rnd, place, done)
        return self._ask_next(rnd, part)

    def _own_as_shown(self, rnd: OpenRound, part: PartCheck, inputs: list[Committed]) -> bool | None:
        """Whether the reducer combined the own part it showed the senders before taking
        theirs (a ``shown`` frame, which they commit to); None: not known until the voters
        still connected have reported (or the round's deadline). A strict majority of the
        senders that say what they were shown decides what that was: one lying sender
        frames nobody. A reducer that combined another part of its own chose it after seeing
        the others': it is expelled. Senders that disagree leave the part undecided: the
        round is discarded, and nobody expelled."""
        reporting = [p for p in rnd.voters if p != part.reducer and p not in rnd.outcomes
                     and p in self.t.members.peers]
        if reporting and self.t.clock() <= rnd.deadline:
            return None
        said = Counter(digest for p, o in rnd.outcomes.items() if p != part.reducer
                       and (digest := _shown(o, part.index)) is not None)
        if not said:
            return True  # nobody sent it a part of its own
        shown, held = said.most_common(1)[0]
        own = next((c.sha256 for c in inputs if c.sender == part.reducer), EMPTY_PART)
        if held * 2 <= sum(said.values()):
            part.passed, part.why = False, "the senders were not all shown the same part of its own"
            return False
        if own != shown:
            part.passed, part.why = False, "it combined another part of its own than it showed the senders"
            self._caught(part)
            return False
        return True

    def _check_time(self, rnd: OpenRound) -> float:
        """How long a checker waits for a reducer's inputs: a part's inputs are about what
        the round moved through that reducer, so a few times the round so far is plenty,
        and never longer than the round's timeout."""
        took = self.t.clock() - rnd.opened_at
        return min(max(CHECK_TIME_FACTOR * took, MIN_CHECK_TIME), self.t.project.round_timeout)

    def _compare_sent(self, rnd: OpenRound, part: PartCheck, inputs: list[Committed]) -> None:
        for committed in inputs:
            if committed.sender == part.reducer:
                continue  # its own part: _own_as_shown
            theirs = rnd.outcomes.get(committed.sender)
            sent = theirs.commitment.sent if theirs is not None and theirs.commitment is not None else []
            if part.index < len(sent) and sent[part.index] and sent[part.index] != committed.sha256:
                log.warning("%s: round %d: %s says it sent part %d another part than %s says it took",
                            self.t.project.id, rnd.round_id, committed.sender, part.index, part.reducer)
                self.t.pairs.keep_apart(committed.sender, part.reducer)

    def _ask_next(self, rnd: OpenRound, part: PartCheck) -> list[Out]:
        """Ask a member that holds the majority state and was not asked yet, at random."""
        assert part.audit is not None and rnd.audit is not None
        now, peers = self.t.clock(), self.t.members.peers
        holders = [p for p in _holders(rnd, rnd.audit.majority)
                   if p != part.reducer and p not in part.asked and p in peers]
        # One resting after a lapse is still asked when nobody else is left: else a single
        # verdict, a liar's perhaps, would discard the round (CI saw every round lost so).
        candidates = sorted([p for p in holders if peers[p].checks_nothing_until <= now] or holders)
        if not candidates:
            agree = sum(part.verdicts.values())
            if agree and agree * 2 == len(part.verdicts):
                # An even split and nobody left to ask. A wrong result has every honest checker
                # against it, so with a wrong reducer the split needs a dishonest majority of
                # these voters; with an honest one, a single liar makes it: side with the result.
                part.passed = True
                self._concluded(rnd, part)
            else:
                part.passed, part.why = False, "no checker left to decide"
                if not agree and part.verdicts:
                    # One voter against the result and none left to ask: the reducer is wrong or
                    # the checker lies. Rounds go on without one of the two (proving newcomers,
                    # who decide next time); else the lie alone would discard every round.
                    (checker,) = part.verdicts
                    log.warning("%s: round %d: nobody left to tell whether %s or %s is right about part %d: "
                                "keeping them apart", self.t.project.id, rnd.round_id, checker, part.reducer,
                                part.index)
                    self.t.pairs.keep_apart(checker, part.reducer)
            return []
        checker = self.rng.choice(candidates)
        part.asked.append(checker)
        part.audit = replace(part.audit, checker=checker)
        # The checker waits up to ``timeout`` for the inputs, then recombines them and answers:
        # it is silent only once it has had as long again.
        part.asked_until = self.t.clock() + 2 * part.audit.timeout
        rnd.deadline = max(rnd.deadline, part.asked_until)
        log.info("%s: round %d: %s checks part %d of %s", self.t.project.id, rnd.round_id, checker,
                 part.index, part.reducer)
        return [Send(part.reducer, part.audit), Send(checker, part.audit)]

    def done(self, rnd: OpenRound, msg: AuditDone, checker: str) -> list[Out]:
        """A checker's verdict."""
        audit = rnd.audit
        part = next((p for p in audit.parts if p.index == msg.index), None) if audit else None
        if (part is None or part.audit is None or part.audit.checker != checker or checker in part.verdicts
                or checker in part.unanswered or checker in part.silent):
            return []
        if not msg.ok and msg.unanswered:
            return self._unanswered(rnd, part, checker, msg.reason)
        part.verdicts[checker] = msg.ok
        if not msg.ok:
            log.warning("%s: round %d: %s finds part %d of %s wrong: %s", self.t.project.id, rnd.round_id,
                        checker, part.index, part.reducer, msg.reason)
        part.decide()
        if part.passed is None:
            return self._ask_next(rnd, part)
        self._concluded(rnd, part)
        return []

    def _unanswered(self, rnd: OpenRound, part: PartCheck, checker: str, reason: str | None) -> list[Out]:
        """A checker got no inputs: ask another, unless enough have got none."""
        part.unanswered.append(checker)
        log.warning("%s: round %d: %s got no inputs for part %d from %s: %s", self.t.project.id, rnd.round_id,
                    checker, part.index, part.reducer, reason)
        if len(part.unanswered) < UNANSWERED:
            return self._ask_next(rnd, part)
        part.passed, part.why = False, f"it did not show its inputs to {len(part.unanswered)} checkers"
        log.warning("%s: round %d: part %d of %s %s: discarding the round", self.t.project.id, rnd.round_id,
                    part.index, part.reducer, part.why)
        reducer = self.t.members.get(part.reducer)
        if reducer is not None:
            self.t.members.reduce_nothing(reducer, "checkers could not get what it combined")
        return []

    def tick(self, rnd: OpenRound) -> list[Out]:
        """A checker that did not answer in time is struck; the next one is asked."""
        audit, now, out = rnd.audit, self.t.clock(), []
        for part in audit.parts if audit else []:
            if part.passed is None and part.audit is not None and now > part.asked_until:
                checker = part.audit.checker
                answered = checker in part.verdicts or checker in part.unanswered
                if not answered and checker not in part.silent:
                    part.silent.add(checker)
                    peer = self.t.members.get(checker)
                    if peer is not None:
                        self.t.members.strike(peer, "it did not check the part it was asked to")
                        self.t.members.check_nothing(peer)
                out += self._ask_next(rnd, part)
        return out

    def _concluded(self, rnd: OpenRound, part: PartCheck) -> None:
        """Expel the checkers the decision went against (honest ones agree: the tolerance
        is far above rounding), and a reducer found wrong."""
        members = self.t.members
        for checker, ok in part.verdicts.items():
            peer = members.get(checker)
            if ok is not part.passed and peer is not None:
                members.expel(peer, "its check of a reducer disagreed with the other checkers'")
        if part.passed is False:
            self._caught(part)

    def _caught(self, part: PartCheck) -> None:
        """The reducer of ``part`` returned what its inputs do not give: expel it."""
        self.caught += 1
        rnd = self.t.round
        log.error("%s: round %d: the result of %s for part %d is wrong (%s): expelling it, discarding "
                  "the round", self.t.project.id, rnd.round_id if rnd else -1, part.reducer, part.index,
                  part.why)
        reducer = self.t.members.get(part.reducer)
        if reducer is not None:
            self.t.members.expel(reducer, "its result did not follow from its inputs")
        rounds = self.unchecked.pop(part.reducer, [])
        if rounds:
            self.withdrawals.append(WithdrawCredits(part.reducer, rounds, f"it was caught: {part.why}"))


def _holders(rnd: OpenRound, majority: Vote) -> list[str]:
    """The voters that reported the majority state."""
    return [p for p, o in rnd.outcomes.items() if p in rnd.voters and vote(o) == majority]


def _shown(outcome: RoundDone, index: int) -> str | None:
    """What the reducer of part ``index`` showed this member of its own part, if it says."""
    shown = outcome.commitment.shown if outcome.commitment is not None else []
    return shown[index] if index < len(shown) else None


def _applied(rnd: OpenRound, member: str, index: int) -> str | None:
    """The hash of the result of part ``index`` that ``member`` says it applied."""
    commitment = rnd.outcomes[member].commitment
    results = commitment.results if commitment is not None else []
    return results[index] if index < len(results) else None
