"""Checking reducers in a PowerSGD project (backbone/tracker/checks.py): a round's parts are
those of phase P (indices 0 .. parts-1) and of phase Q (parts .. 2 parts-1), each drawn on
its own, sized by the lengths the holders report per phase, reduced by one reducer in both
phases; a lie in either phase is found and costs the reducer as any lie does."""

import random

from engine.backbone.tracker import RecordCredits, RecordStep
from engine.planning.partition import part_bounds, part_sizes
from engine.project import AggregationSpec
from engine.wire.commitments import Commitment, Committed, PartInputs
from engine.wire.control import Audit, AuditDone, Resync
from tests.unit.test_auxiliary_tracker import aux_done, with_auxiliary
from tests.unit.tracker_helpers import Clock, clock, done, open_round, ready_tracker, sent

__all__ = ["clock"]  # the fixture

PEERS = ("a", "b", "c", "d")
P_NUMEL, Q_NUMEL = 5_000, 1_200


def powersgd_tracker(probability=1.0, seed=1, peers=PEERS):
    clock = Clock()
    t = ready_tracker(clock, peers=peers, compression="powersgd",
                      aggregation=AggregationSpec(verify_probability=probability))
    t.audits.rng = random.Random(seed)
    return t, clock


def two_phase_done(start, results, member, phase_numel=(P_NUMEL, Q_NUMEL), reduced_q=True):
    """A member's outcome committing to both phases: its own part j as index j (phase P)
    and parts + j (phase Q)."""
    parts = len(start.group)
    j = start.group.index(member)
    inputs = [Committed(sender=s, samples=30, sha256="p" * 64) for s in start.group]
    reduced = [PartInputs(index=j, inputs=inputs)]
    if reduced_q:
        reduced.append(PartInputs(index=parts + j, inputs=inputs))
    commitment = Commitment(sent=["p" * 64] * 2 * parts, results=list(results), reduced=reduced,
                            shown=[])
    return done(start, commitment=commitment, numel=10_000, phase_numel=list(phase_numel))


def run_round(t, **kw):
    start = open_round(t, {p: 30 for p in start_peers(t)})
    results = [f"{j % 10}" * 64 for j in range(2 * len(start.group))]
    outs = []
    for member in start.group:
        outs += t.handle(member, two_phase_done(start, results, member, **kw))
    return start, outs


def start_peers(t):
    return sorted(t.members.peers)


def test_both_phases_parts_are_drawn_and_checked_with_their_reducers_inputs():
    t, _ = powersgd_tracker()
    start, outs = run_round(t)
    parts = len(start.group)
    audits = {a.index: a for _, a in sent(outs, Audit)}
    assert set(audits) == set(range(2 * parts))
    for index, audit in audits.items():
        assert audit.reducer == start.group[index % parts]  # one reducer for both phases
        assert audit.result_sha256 == f"{index % 10}" * 64
    for index, audit in audits.items():
        t.handle(audit.checker, AuditDone(round_id=start.round_id, index=index, ok=True))
    assert t.epoch == 1 and t.round is None


def test_a_reducer_found_wrong_in_phase_q_alone_is_expelled_and_the_round_discarded():
    t, _ = powersgd_tracker()
    start, outs = run_round(t)
    parts = len(start.group)
    audits = {a.index: a for _, a in sent(outs, Audit)}
    lied = parts + 1  # b's part of phase Q
    for index, audit in audits.items():
        if index != lied:
            t.handle(audit.checker, AuditDone(round_id=start.round_id, index=index, ok=True))
    first = audits[lied]
    again = t.handle(first.checker, AuditDone(round_id=start.round_id, index=lied, ok=False, reason="wrong"))
    second = next(a for _, a in sent(again, Audit) if a.index == lied)
    outs = t.handle(second.checker, AuditDone(round_id=start.round_id, index=lied, ok=False, reason="wrong"))
    assert t.epoch == 0 and t.round is None and not [o for o in outs if isinstance(o, RecordStep)]
    assert {to for to, _ in sent(outs, Resync)} == set(start.group)  # back to the kept state
    assert t.members.get("b").excluded_until > t.clock() + 600


def test_a_reducer_that_names_no_inputs_for_its_phase_q_part_cannot_have_its_round_kept():
    t, _ = powersgd_tracker()
    start, outs = run_round(t, reduced_q=False)
    parts = len(start.group)
    audits = {a.index for _, a in sent(outs, Audit)}
    assert audits == set(range(parts))  # its phase-Q parts failed at once: no checker asked
    for _, audit in sent(outs, Audit):
        t.handle(audit.checker, AuditDone(round_id=start.round_id, index=audit.index, ok=True))
    assert t.epoch == 0


def test_each_phase_is_cut_by_its_own_length_and_an_empty_part_is_never_drawn():
    t, _ = powersgd_tracker()
    start = open_round(t, {p: 30 for p in PEERS})
    t.round.shares = [0.6, 0.4 - 3e-6, 3e-6, 0.0]
    parts = len(start.group)
    q_sizes = [hi - lo for lo, hi in part_bounds(Q_NUMEL, t.round.shares)]
    assert q_sizes[2] == 0
    results = [f"{j % 10}" * 64 for j in range(2 * parts)]
    outs = []
    for member in start.group:
        outs += t.handle(member, two_phase_done(start, results, member))
    drawn = {a.index for _, a in sent(outs, Audit)}
    assert parts + 2 not in drawn and parts + 3 not in drawn and {parts, parts + 1} <= drawn


def test_a_voter_that_understates_phase_q_hides_none_of_its_parts():
    t, _ = powersgd_tracker(peers=("a", "b"))
    start = open_round(t, {"a": 60, "b": 60})
    results = [f"{j}" * 64 for j in range(4)]
    outs = []
    for member in start.group:
        lengths = (P_NUMEL, 1) if member == "b" else (P_NUMEL, Q_NUMEL)
        outs += t.handle(member, two_phase_done(start, results, member, phase_numel=lengths))
    assert {a.index for _, a in sent(outs, Audit)} == {0, 1, 2, 3}


def test_an_auxiliary_reducer_is_credited_with_the_bytes_of_both_phases(clock):
    t = with_auxiliary(clock, "x", compression="powersgd")
    start = open_round(t, {"a": 50, "b": 50})
    assert t.round.phases == 2
    outs = t.handle("x", aux_done(start, numel=100_000, phase_numel=[P_NUMEL, Q_NUMEL]))
    for p in "ab":
        outs += t.handle(p, done(start, numel=100_000, phase_numel=[P_NUMEL, Q_NUMEL],
                                 received={"a": 50, "b": 50}))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    x = start.group.index("x")
    parts = [part_sizes(n, start.shares)[x] for n in (P_NUMEL, Q_NUMEL)]
    assert record.credits["x"].aggregated_bytes == 2 * 4 * sum(parts)  # two senders, fp32 factors


def test_a_reducer_lost_between_the_phases_has_its_round_redone_at_no_ones_cost():
    """b combined its part of phase P, then left; c took over its part of phase Q. Nobody can
    show what b combined, so the round is redone -- and c, which did all it was asked, keeps
    its standing."""
    t, _ = powersgd_tracker()
    start = open_round(t, {p: 30 for p in PEERS})
    parts = len(start.group)
    lost = start.group[1]
    t.leave(lost)
    backup = t.round.reducer_of(1)
    assert backup != lost
    results = [f"{j % 10}" * 64 for j in range(2 * parts)]
    outs = []
    inputs = [Committed(sender=s, samples=30, sha256="p" * 64) for s in start.group]
    for member in (p for p in start.group if p != lost):
        j = start.group.index(member)
        reduced = [PartInputs(index=j, inputs=inputs), PartInputs(index=parts + j, inputs=inputs)]
        if member == backup:
            reduced.append(PartInputs(index=parts + 1, inputs=inputs))  # phase Q only
        commitment = Commitment(sent=["p" * 64] * 2 * parts, results=results, reduced=reduced, shown=[])
        outs += t.handle(member, done(start, commitment=commitment, numel=10_000,
                                      phase_numel=[P_NUMEL, Q_NUMEL]))
    for _, audit in sent(outs, Audit):
        outs += t.handle(audit.checker, AuditDone(round_id=start.round_id, index=audit.index, ok=True))
    assert t.epoch == 0 and t.round is None
    assert {to for to, _ in sent(outs, Resync)} == set(start.group) - {lost}
    why = next(r.reason for _, r in sent(outs, Resync))
    assert f"{lost} left the round after combining it" in why
    assert t.members.get(backup).excluded_until <= t.clock()
    assert t.members.get(backup).strikes == 0
