"""The backbone's side of grouped rounds: when a round runs in groups, and how its members
are credited (engine/backbone/tracker/scheduling.py, settlement.py)."""

import json

import pytest

from engine.backbone.tracker import RecordCredits
from engine.project import AggregationSpec
from engine.wire import ProtocolError
from engine.wire.codec import encode
from engine.wire.control import Progress, Ready, SyncRequest, from_backbone
from engine.wire.types import PeerRole
from tests.unit.test_tracker import Clock, done, open_round, project, ready_tracker

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


def test_grouped_rounds_that_would_go_unchecked_are_refused_in_the_project_file():
    with pytest.raises(ValueError, match=r"set aggregation\.verify_probability to 0"):
        project(group_size=4, aggregation=AggregationSpec(verify_probability=0.1))
    assert project(group_size=4, compression="powersgd").group_size == 4


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
