"""What the reducer checks hold against (issue: a stranger with no compute): a reducer's own
part is fixed before it sees anyone else's, a caught reducer loses the credit of what it
reduced unchecked, a lying checker can neither discard rounds of three nor stall two
voters, a silent one costs seconds, and parts are drawn at the stated probability. Driven
without a network."""

import math
import random

from engine.backbone.tracker import RecordCredits
from engine.backbone.tracker.checks import MIN_CHECK_TIME
from engine.backbone.tracker.outputs import WithdrawCredits
from engine.wire.commitments import EMPTY_PART, Commitment, Committed, PartInputs
from engine.wire.control import Audit, AuditDone, Ready, SyncRequest
from tests.unit.test_reducer_checks import PEERS, checked_tracker, first_audit, run_round
from tests.unit.tracker_helpers import Clock, done, open_round, ready_tracker, sent


def own(member: str, j: int) -> str:
    """The hash of ``member``'s own part ``j``, as a test writes it."""
    return f"{member}{j}".ljust(64, "0")


def round_with_shown(t, combined_own=None, told=None, empty=False):
    """A round where every reducer showed the senders its own part and combined
    ``combined_own`` (index -> the own part it committed to combining; default the one it
    showed), each member saying it was shown the truth unless ``told`` says otherwise
    (member -> {index: what it says}). ``empty``: no reducer had samples of its own."""
    start = open_round(t, {p: 30 for p in PEERS})
    group = start.group
    results = [f"{j}" * 64 for j in range(len(group))]
    truth = [EMPTY_PART if empty else own(m, k) for k, m in enumerate(group)]
    outs = []
    for j, member in enumerate(group):
        mine = (combined_own or {}).get(j, truth[j])
        inputs = [Committed(sender=s, samples=30, sha256=mine if s == member else "p" * 64)
                  for s in group if s != member or not empty]
        seen = [(told or {}).get(member, {}).get(k, truth[k]) for k in range(len(group))]
        commitment = Commitment(sent=["p" * 64] * len(group), results=results,
                                reduced=[PartInputs(index=j, inputs=inputs)], shown=seen)
        outs += t.handle(member, done(start, commitment=commitment))
    return start, outs


def pass_every_check(t, start, outs):
    for _, audit in sent(outs, Audit):
        t.handle(audit.checker, AuditDone(round_id=start.round_id, index=audit.index, ok=True))


def test_a_reducer_that_combined_another_own_part_than_it_showed_is_expelled():
    """Before: nobody committed to a reducer's own part, so a wrong reducer could commit its
    own input as target x total minus the others' parts, and the recheck found its -1x
    result consistent."""
    t, _ = checked_tracker()
    start, outs = round_with_shown(t, combined_own={0: "f" * 64})
    liar = start.group[0]
    assert t.round is None and t.epoch == 0  # discarded
    assert t.members.get(liar).excluded_until > t.clock() + 600
    assert not any(a.index == 0 for _, a in sent(outs, Audit))  # caught before any checker was asked


def test_one_sender_that_lies_about_what_it_was_shown_frames_nobody():
    t, _ = checked_tracker()
    start, outs = round_with_shown(t, told={PEERS[1]: {0: "e" * 64}})
    pass_every_check(t, start, outs)
    assert t.epoch == 1
    assert all(t.members.get(p).excluded_until == 0 for p in start.group)


def test_a_reducer_with_no_samples_of_its_own_shows_the_empty_part():
    t, _ = checked_tracker()
    start, outs = round_with_shown(t, empty=True)
    audits = sent(outs, Audit)
    assert audits and all(a.caps and len(a.caps) == len(a.inputs) for _, a in audits)
    pass_every_check(t, start, outs)
    assert t.epoch == 1


def test_a_caught_reducer_loses_the_credit_of_every_round_it_reduced_since_its_last_check():
    """Before: a reducer's uncaught lies kept their credit after it was expelled."""
    t, _ = checked_tracker(probability=1e-12)  # checked, and never drawn: until the test says so
    credited = {}
    for epoch in range(3):
        start, outs = round_with_shown(t)
        credited.update({o.round_id: o for o in outs if isinstance(o, RecordCredits)})
        assert t.epoch == epoch + 1
    liar = start.group[0]
    t.project.aggregation.verify_probability = 1.0
    start, outs = round_with_shown(t, combined_own={0: "f" * 64})
    (withdrawn,) = [o for o in outs if isinstance(o, WithdrawCredits)]
    assert withdrawn.peer_id == liar and withdrawn.round_ids == sorted(credited)
    assert "caught" in withdrawn.why


def test_a_passed_check_clears_what_a_reducer_would_lose():
    t, _ = checked_tracker(probability=1.0)
    start, outs = round_with_shown(t)
    pass_every_check(t, start, outs)
    assert t.epoch == 1 and t.audits.unchecked == {}


def reduced_round_of_three(clock):
    """A round of a, b and c, every part checked, each member reporting the part it reduced;
    the tracker, the round and what it sent."""
    t = ready_tracker(clock, peers=("a", "b", "c"))
    t.project.aggregation.verify_probability = 1.0
    t.audits.rng = random.Random(4)
    start = open_round(t, {p: 40 for p in "abc"})
    results = [f"{j}" * 64 for j in range(3)]
    outs = []
    for member in start.group:
        inputs = [Committed(sender=s, samples=40, sha256="p" * 64) for s in start.group]
        commitment = Commitment(sent=["p" * 64] * 3, results=results,
                                reduced=[PartInputs(index=start.group.index(member), inputs=inputs)])
        outs += t.handle(member, done(start, commitment=commitment))
    return t, start, outs


def test_in_a_round_of_three_a_lying_checker_cannot_discard_it():
    """Before: one checker said wrong, the other right, and with nobody left to ask the round
    was discarded and nobody expelled -- a lie that cost its teller nothing."""
    clock = Clock()
    t, start, outs = reduced_round_of_three(clock)
    for j in (1, 2):
        audit = first_audit(outs, j)
        t.handle(audit.checker, AuditDone(round_id=start.round_id, index=j, ok=True))
    first = first_audit(outs, 0)
    second = first_audit(t.handle(first.checker, AuditDone(round_id=start.round_id, index=0, ok=False)), 0)
    t.handle(second.checker, AuditDone(round_id=start.round_id, index=0, ok=True))
    assert t.epoch == 1, "an even split with nobody left to ask keeps the result"
    assert t.members.get(first.checker).excluded_until > clock.now + 600
    assert t.members.get(first.reducer).excluded_until == 0


def test_a_silent_checker_holds_a_quick_round_for_seconds_not_minutes():
    """Before: a proven member that never answered an Audit held the round for twice the
    round's timeout (240 s in demo-lm)."""
    t, clock = checked_tracker()
    t.project.round_timeout = 120
    _, outs = run_round(t)
    audit = first_audit(outs, 0)
    assert audit.timeout == MIN_CHECK_TIME
    clock.now += 2 * MIN_CHECK_TIME + 0.5
    nxt = first_audit(t.tick(), 0)
    assert nxt.checker != audit.checker and t.members.get(audit.checker).strikes >= 1


def test_a_wrong_reducer_is_caught_at_the_stated_probability():  # (about 10 s)
    """Over many rounds with the backbone's own random source, the number of lies a reducer
    gets away with before it is caught follows the geometric law of the stated probability
    (mean 1/p - 1): a draw that missed some parts would show as more."""
    p, trials = 0.1, 400
    escaped = []
    for _ in range(trials):
        t, _ = checked_tracker(probability=p, seed=None)
        t.audits.rng = random.SystemRandom()
        lies = 0
        while True:
            start, outs = run_round(t)
            liar_part = start.group.index("a")
            drawn = {a.index for _, a in sent(outs, Audit)}
            if liar_part in drawn:
                break
            for _, audit in sent(outs, Audit):
                if audit.checker != "-":
                    t.handle(audit.checker, AuditDone(round_id=start.round_id, index=audit.index, ok=True))
            assert t.round is None
            lies += 1
        escaped.append(lies)
    mean = sum(escaped) / trials
    expected = 1 / p - 1
    spread = math.sqrt((1 - p) / p**2 / trials)  # the standard error of the mean
    assert abs(mean - expected) < 4 * spread, (mean, expected)
    assert sum(e >= 40 for e in escaped) <= trials * ((1 - p) ** 40 + 4 * math.sqrt(0.015 / trials))


def test_checks_start_once_every_voter_still_here_has_reported():
    """What each sender was shown decides a reducer's own part, and every voter may be a
    checker: in a round of three, a liar that reported early must not be the only checker
    at hand (CI saw it call every part wrong with the third voter yet to report, and each
    round discarded)."""
    clock = Clock()
    t = ready_tracker(clock, peers=("a", "b", "c"))
    t.project.aggregation.verify_probability = 1.0
    start = open_round(t, {p: 40 for p in "abc"})
    results = [f"{j}" * 64 for j in range(3)]

    def report(member):
        inputs = [Committed(sender=s, samples=40, sha256="p" * 64) for s in start.group]
        commitment = Commitment(sent=["p" * 64] * 3, results=results,
                                reduced=[PartInputs(index=start.group.index(member), inputs=inputs)])
        return t.handle(member, done(start, commitment=commitment))

    assert not sent(report("a") + report("b"), Audit)
    outs = report("c")
    audits = [a for _, a in sent(outs, Audit)]
    assert {a.index for a in audits} == {0, 1, 2}
    pass_every_check(t, start, outs)
    assert t.epoch == 1


def test_a_checker_that_let_a_check_lapse_is_asked_to_check_nothing_for_a_while():
    """Each lapse held the round for the checker's whole time, and its strikes were forgiven at
    its next agreeing step: CI saw it asked again and again, a round every 20 s."""
    t, clock = checked_tracker()
    start, outs = run_round(t)
    lapsed = first_audit(outs, 0)
    for _, audit in sent(outs, Audit):  # every other check is answered in time
        if audit.checker not in (lapsed.checker, "-"):
            t.handle(audit.checker, AuditDone(round_id=start.round_id, index=audit.index, ok=True))
    clock.now += 2 * lapsed.timeout + 0.5
    outs = t.tick()  # (it may have been asked about more than one part: each goes to another)
    assert {a.checker for _, a in sent(outs, Audit)}.isdisjoint({lapsed.checker})
    assert t.members.get(lapsed.checker).checks_nothing_until > clock.now
    pass_every_check(t, start, outs)
    assert t.epoch == 1
    asked = []
    for _ in range(4):  # proven again after a round or two, and still never asked for a while
        start, outs = run_round(t, samples=40)  # (the three others alone reach the target)
        asked += [a.checker for _, a in sent(outs, Audit)]
        pass_every_check(t, start, outs)
        assert t.round is None
    assert t.members.get(lapsed.checker).proven and lapsed.checker not in asked


def test_a_checker_resting_after_a_lapse_is_asked_when_a_lie_would_otherwise_discard_the_round():
    """In a round of three whose third member let a check lapse a while ago, a liar's verdict
    alone discarded every round: CI saw a collaboration lose rounds for two minutes so."""
    clock = Clock()
    t, start, outs = reduced_round_of_three(clock)
    first = first_audit(outs, 0)
    resting = next(p for p in "abc" if p not in (first.checker, first.reducer))
    t.members.get(resting).checks_nothing_until = clock.now + 60
    for j in (1, 2):
        audit = first_audit(outs, j)
        t.handle(audit.checker, AuditDone(round_id=start.round_id, index=j, ok=True))
    second = first_audit(t.handle(first.checker, AuditDone(round_id=start.round_id, index=0, ok=False)), 0)
    assert second.checker == resting
    t.handle(second.checker, AuditDone(round_id=start.round_id, index=0, ok=True))
    assert t.epoch == 1
    assert t.members.get(first.checker).excluded_until > clock.now + 600


def test_a_lying_checker_beside_one_other_voter_cannot_stall_the_collaboration():
    """With two voters and a newcomer on probation, a checker that called the other voter's
    part wrong discarded every round: nobody was left to outvote it, and the newcomer, who
    is proven only by a round that settles, never became that third voter."""
    clock = Clock()
    t = ready_tracker(clock, peers=("a", "b"))
    t.audits.rng = random.Random(4)
    liar, lies = "b", 0

    def play_round(samples):
        nonlocal lies
        start = open_round(t, samples)
        results = [f"{j}" * 64 for j in range(len(start.group))]
        outs = []
        for j, member in enumerate(start.group):
            inputs = [Committed(sender=s, samples=40, sha256="p" * 64) for s in start.group]
            reduced = [PartInputs(index=j, inputs=inputs)] if start.shares[j] > 0 else []
            commitment = Commitment(sent=["p" * 64] * len(start.group), results=results, reduced=reduced)
            outs += t.handle(member, done(start, digest=f"h{start.epoch + 1}", commitment=commitment))
        while audits := list({a.index: a for _, a in sent(outs, Audit)}.values()):  # (to reducer and checker)
            outs = []
            for audit in audits:
                lies += audit.checker == liar
                outs += t.handle(audit.checker, AuditDone(round_id=start.round_id, index=audit.index,
                                                          ok=audit.checker != liar))
        for p in t.members.peers.values():  # back on the settled state, as told
            if not p.ready:
                t.handle(p.peer_id, Ready(t.epoch, t.state_sha256))
        return start

    t.project.aggregation.verify_probability = 0.0
    play_round({"a": 60, "b": 60})  # a and b prove themselves
    t.project.aggregation.verify_probability = 1.0
    t.join("c", "c")
    t.handle("c", SyncRequest())
    t.handle("c", Ready(t.epoch, t.state_sha256))
    first = play_round({p: 120 for p in "abc"})
    assert "c" in first.optional and lies == 1 and t.epoch == 1, "the lie, alone, discards the round"
    groups = [play_round({p: 120 for p in "abc"}).group for _ in range(10)]
    assert t.epoch == 11 and all(len(g) == 2 for g in groups), "rounds go on without one of the two"
    clock.now += 60  # the pair's pause is over: in a round of three, the lie costs its teller
    while t.members.get(liar).excluded_until <= clock.now and t.epoch < 30:
        play_round({p: 120 for p in "abc"})
    assert t.members.get(liar).excluded_until > clock.now + 600
    assert t.members.get("a").excluded_until == 0 and t.members.get("c").excluded_until == 0
