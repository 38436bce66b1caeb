"""The backbone's side of grouped rounds: when a round runs in groups, and how its members
are credited (engine/backbone/tracker/scheduling.py, settlement.py)."""

import json

import pytest

from engine.backbone.tracker import RecordCredits
from engine.planning.grouped_indices import GroupedIndices
from engine.planning.partition import part_sizes
from engine.project import AggregationSpec
from engine.wire import ProtocolError
from engine.wire.codec import encode
from engine.wire.commitments import Commitment, Committed, PartInputs
from engine.wire.control import Audit, Progress, Ready, Reassign, SyncRequest, from_backbone
from engine.wire.types import PeerRole
from tests.unit.tracker_helpers import Clock, done, open_round, ready_tracker, sent

TWELVE = tuple(f"p{i:02}" for i in range(12))


@pytest.fixture
def clock():
    return Clock()


def grouped_tracker(clock, peers=TWELVE, **kw):
    return ready_tracker(clock, peers=peers, group_size=4, target_batch_size=120, **kw)


def test_a_round_of_more_members_than_the_group_size_runs_in_groups_and_a_small_one_flat(clock):
    t = grouped_tracker(clock)
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    groups = start.groups
    assert groups is not None and sorted(map(len, groups.groups)) == [4, 4, 4]
    assert sorted(p for g in groups.groups for p in g) == sorted(start.group)
    # Every member reduces one slot (12 may reduce, 4 slots per group), its share that slot's.
    shares = dict(zip(start.group, start.shares, strict=True))
    for reducers in groups.reducers:
        assert [shares[r] for r in reducers] == pytest.approx(groups.slot_shares)
    assert from_backbone.decode(encode(start)) == start
    small = grouped_tracker(clock, peers=TWELVE[:4])
    assert open_round(small, dict.fromkeys(TWELVE[:4], 30)).groups is None


def test_the_next_round_keeps_the_groups_and_so_the_links(clock):
    t = grouped_tracker(clock)
    first = open_round(t, dict.fromkeys(TWELVE, 10))
    for p in TWELVE:
        t.handle(p, done(first))
    # Links measured in the meantime, a little apart: the groups stay.
    for i, p in enumerate(TWELVE):
        t.handle(p, Progress(1, 0, 10.0, upload=1e6 * (1 + i / 40), download=5e6))
    second = open_round(t, dict.fromkeys(TWELVE, 10))
    assert second.epoch == 1
    assert second.groups is not None and second.groups.groups == first.groups.groups
    assert second.groups.reducers == first.groups.reducers


def test_each_member_is_credited_with_what_its_own_groups_reducers_saw(clock):
    t = grouped_tracker(clock)
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    groups = start.groups.groups
    liar = groups[0][0]
    outs = []
    for members in groups:
        for p in members:
            # A reducer reports the parts of its own group only; one liar in the first group
            # says its group's members sent far more, and that the others sent nothing.
            seen = {m: 10 for m in members}
            if p == liar:
                seen = {m: 10**6 for m in members} | {q: 0 for g in groups[1:] for q in g}
            outs += t.handle(p, done(start, received=seen))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert {p: c.samples for p, c in record.credits.items()} == dict.fromkeys(TWELVE, 10)


def test_a_member_its_group_did_not_see_gets_no_credit(clock):
    t = grouped_tracker(clock)
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    members = start.groups.groups[1]
    silent = members[-1]
    outs = []
    for p in start.group:
        seen = {m: 10 for g in start.groups.groups for m in g if p in g and m != silent}
        outs += t.handle(p, done(start, received=seen))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert silent not in record.credits and len(record.credits) == 11


def test_a_lost_slot_reducers_slot_goes_to_a_backup_of_its_own_group(clock):
    t = grouped_tracker(clock)
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    groups = start.groups.groups
    lost = start.groups.reducers[1][0]
    told = sent(t.leave(lost), Reassign)
    assert sorted(to for to, _ in told) == sorted(p for p in TWELVE if p != lost)
    msg = told[0][1]
    backup = msg.reducers[start.group.index(lost)]
    assert msg.lost == [lost] and backup in groups[1] and backup != lost
    now = t.round.slot_reducers()
    assert now[1] == [backup, *start.groups.reducers[1][1:]]
    assert [now[0], now[2]] == [start.groups.reducers[0], start.groups.reducers[2]]
    share = dict(zip(start.group, start.shares, strict=True))
    assert t.round.weights()[backup] == pytest.approx(share[backup] + share[lost])
    outs = []
    for members in groups:
        for p in members:
            if p != lost:
                outs += t.handle(p, done(start, received={m: 10 for m in members if m != lost}))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    assert t.epoch == 1 and set(record.credits) == set(TWELVE) - {lost}


def test_a_backup_that_gives_its_round_up_fails_it_at_once_for_everyone(clock):
    """(It stood in for a reducer that had finished a piece before it left.)"""
    t = grouped_tracker(clock)
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    lost = start.groups.reducers[1][0]
    ((_, msg), *_) = sent(t.leave(lost), Reassign)
    backup = msg.reducers[start.group.index(lost)]
    other = next(p for p in TWELVE if p not in (backup, lost))
    assert not sent(t.handle(other, done(start, ok=False)), Reassign)  # (it took no slot over)
    told = sent(t.handle(backup, done(start, ok=False)), Reassign)
    assert sorted(to for to, _ in told) == sorted(p for p in TWELVE if p != lost)
    assert told[0][1].reducers[start.group.index(lost)] == lost  # (nobody reduces its slot now)
    assert t.round.slot_reducers()[1][0] == lost


def test_a_lost_slot_reducer_whose_group_has_nobody_left_fails_the_round_at_once(clock):
    t = grouped_tracker(clock)
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    members, reducers = start.groups.groups[2], start.groups.reducers[2]
    for p in members:
        if p != reducers[0]:
            t.leave(p)
    ((_, msg), *_) = sent(t.leave(reducers[0]), Reassign)
    # Nobody of its group took its slot: the members' rounds fail now, not at the deadline.
    assert msg.reducers[start.group.index(reducers[0])] == reducers[0]


def test_a_round_start_whose_groups_do_not_hold_its_members_is_refused():
    start = {"type": "round_start", "round_id": 1, "epoch": 0, "group": ["a", "b", "c", "d"],
             "shares": [1, 0, 1, 0], "timeout": 5,
             "groups": {"groups": [["a", "b"], ["c", "e"]], "reducers": [["a"], ["c"]], "slot_shares": [1.0],
                        "pieces": [[0.5, 0.5]]}}
    with pytest.raises(ProtocolError, match="each member once"):
        from_backbone.decode(json.dumps(start))
    start["groups"]["groups"] = [["a", "b"], ["c", "d"]]
    start["groups"]["reducers"] = [["a"], ["b"]]
    with pytest.raises(ProtocolError, match="reducers are its own members"):
        from_backbone.decode(json.dumps(start))
    start["groups"]["reducers"] = [["a"], ["c"]]
    assert from_backbone.decode(json.dumps(start)).groups is not None


def test_when_a_member_leaves_and_another_joins_the_rest_keep_their_groups(clock):
    t = grouped_tracker(clock)
    first = open_round(t, dict.fromkeys(TWELVE, 10))
    for p in TWELVE:
        t.handle(p, done(first))
    gone = first.groups.groups[0][1]
    t.leave(gone)
    t.join("newcomer", "newcomer")
    t.handle("newcomer", SyncRequest())
    t.handle("newcomer", Ready(1, "h1"))
    now = [p for p in TWELVE if p != gone]
    second = open_round(t, dict.fromkeys(now, 12))
    assert second.groups is not None and "newcomer" in second.group
    for before, after in zip(first.groups.groups, second.groups.groups, strict=True):
        stayed = [p for p in before if p != gone]
        assert after[:len(stayed)] == stayed
    assert second.groups.groups[0][-1] == "newcomer"  # (the group it left was the smallest)


def test_an_auxiliary_peer_reduces_a_slot_of_a_grouped_round_and_brings_no_gradient(clock):
    t = grouped_tracker(clock, peers=TWELVE[:8])
    t.join("aux", "aux", PeerRole.AUXILIARY)
    t.handle("aux", Progress(0, 0, 0.0, upload=50e6, download=50e6))
    for p in TWELVE[:8]:
        t.handle(p, Progress(0, 0, 0.0, upload=1e6, download=1e6))
    start = open_round(t, dict.fromkeys(TWELVE[:8], 15))
    assert start.groups is not None and start.auxiliary == ["aux"]
    (mine,) = [g for g in start.groups.reducers if "aux" in g]
    assert from_backbone.decode(encode(start)) == start
    # Its share is its slot's; the members of its group send it their parts of that slot.
    shares = dict(zip(start.group, start.shares, strict=True))
    assert shares["aux"] == pytest.approx(start.groups.slot_shares[mine.index("aux")])
    assert t.round.voters == [p for p in start.group if p != "aux"]

    # Credited with what it took in at both levels: its slot from its group's trainers, and
    # its piece of that slot from the other groups' reducers.
    groups = start.groups.groups
    (group,) = [g for g, members in enumerate(groups) if "aux" in members]
    numel = 100_000
    outs = []
    for members in groups:
        for p in members:
            seen = {m: 15 for m in members if m != "aux"}
            if p == "aux":  # (it claims every member of the round sent it a part: credit for its own)
                seen = {m: 15 for m in start.group if m != "aux"}
            outs += t.handle(p, done(start, received=seen, numel=numel if p != "aux" else 0))
    (record,) = [o for o in outs if isinstance(o, RecordCredits)]
    k = mine.index("aux")
    slot = part_sizes(numel, start.groups.slot_shares)[k]
    piece = part_sizes(slot, start.groups.pieces[k])[group]
    assert slot > 0
    trainers = len(groups[group]) - 1
    assert record.credits["aux"].aggregated_bytes == 4 * (slot * trainers + piece * (len(groups) - 1))


def test_a_checked_grouped_round_draws_parts_of_both_levels_and_checks_level_one_against_what_was_sent_on(
        clock):
    t = grouped_tracker(clock, aggregation=AggregationSpec(verify_probability=1.0))
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    groups = start.groups
    indices = GroupedIndices([len(g) for g in groups.groups], len(groups.slot_shares))
    count = indices.count
    audits = []
    for g, (members, reducers) in enumerate(zip(groups.groups, groups.reducers, strict=True)):
        for p in members:
            sent, results = ["s" * 64] * count, ["r" * 64] * count
            reduced = []
            if p in reducers:  # its level-1 slot, and its level-2 piece of that slot
                k = reducers.index(p)
                mine, piece = indices.level_one_offset(g) + k, indices.level_two_offset(k) + g
                results[mine] = f"{g}{k}".ljust(64, "a")
                pieces = range(indices.level_two_offset(k), indices.level_two_offset(k) + 3)
                sent = [f"{g}{k}{i}".ljust(64, "f") if i in pieces else s for i, s in enumerate(sent)]
                reduced = [PartInputs(index=mine, inputs=[Committed(sender=q, samples=10, sha256="s" * 64)
                                                          for q in members]),
                           PartInputs(index=piece, inputs=[Committed(sender=r[k], samples=40, sha256="s" * 64)
                                                           for r in groups.reducers])]
            commitment = Commitment(sent=sent, results=results, reduced=reduced, shown=[None] * count)
            audits += sent_audits(t.handle(p, done(start, received={q: 10 for q in members},
                                                   commitment=commitment, numel=12_000)))
    levels = {indices.place(a.index).level for a in audits}
    assert levels == {1, 2}
    caps = {p: m.cap for p, m in t.round.members.items()}
    for a in audits:
        place = indices.place(a.index)
        k = place.slot
        if place.level == 1:  # the reducer's own result, and the level-2 parts it committed to
            assert a.result_sha256 == f"{place.group}{k}".ljust(64, "a")
            pieces = range(indices.level_two_offset(k), indices.level_two_offset(k) + 3)
            assert a.forwarded == [f"{place.group}{k}{i}".ljust(64, "f") for i in pieces]
            assert a.pieces == groups.pieces[k] and a.caps == [caps[c.sender] for c in a.inputs]
            assert a.judged and not a.group_sums
        else:  # what every member applied; each group's reducer counts for its group's caps
            assert a.result_sha256 == "r" * 64 and not a.forwarded and a.group_sums
            group_of = {p: g for g in groups.groups for p in g}
            assert a.caps == [sum(caps[q] for q in group_of[c.sender]) for c in a.inputs]


def sent_audits(outs) -> list[Audit]:
    return [msg for _, msg in sent(outs, Audit) if msg.checker != "-"]


def test_a_level_two_part_a_lost_reducer_sent_before_it_left_counts_for_its_groups_caps(clock):
    """The lost reducer's backup took its slot; a piece another reducer finished with the
    lost one's sum is checked with that sum weighing as its group's samples, as the reducer
    weighed it -- not as nobody's (which would make an honest reducer's result look wrong)."""
    t = grouped_tracker(clock, aggregation=AggregationSpec(verify_probability=1.0))
    start = open_round(t, dict.fromkeys(TWELVE, 10))
    groups = start.groups
    lost = groups.reducers[1][0]
    caps = {p: m.cap for p, m in t.round.members.items()}
    t.leave(lost)
    indices = GroupedIndices([len(g) for g in groups.groups], len(groups.slot_shares))
    piece = indices.level_two_offset(0)  # slot 0's piece that group 0's reducer finishes
    audits = []
    for members in groups.groups:
        for p in members:
            if p == lost:
                continue
            reduced = []
            if p == groups.reducers[0][0]:
                reduced = [PartInputs(index=piece, inputs=[Committed(sender=r[0], samples=40, sha256="s" * 64)
                                                           for r in groups.reducers])]
            commitment = Commitment(sent=["s" * 64] * indices.count, results=["r" * 64] * indices.count,
                                    reduced=reduced, shown=[None] * indices.count)
            audits += sent_audits(t.handle(p, done(start, received={q: 10 for q in members if q != lost},
                                                   commitment=commitment, numel=12_000)))
    checks = [a for a in audits if a.index == piece]
    assert checks and all(a.inputs[1].sender == lost for a in checks)
    assert all(a.caps[1] == sum(caps[q] for q in groups.groups[1]) > 0 for a in checks)
