"""Grouped rounds with real `cotrain peer` processes: twelve peers in groups of four."""

import statistics

import pytest

from engine.backbone.tracker import Send
from engine.project import AggregationSpec
from engine.wire.control import RoundStart
from tests.collab.harness import running_backbone, tiny_project
from tests.collab.processes import (
    kill_as_a_round_begins,
    settled_without_a_redo,
    spawn_peer,
    survivors_step,
    terminate,
)
from tests.conftest import until

pytestmark = pytest.mark.slow

PEERS, GROUP_SIZE, EPOCHS = 12, 4, 4


async def collaboration(tmp_path, group_size: int | None, checks: list | None = None,
                        ids: dict | None = None, **options) -> tuple[list, list[RoundStart]]:
    """Twelve peers for EPOCHS steps; their epochs and the rounds the backbone opened (and,
    into ``checks``, how many parts it drew for checking and how many failed).
    Rounds open once all twelve are in: every peer starts from the project's seed, so
    nobody downloads the state, and every link a peer holds is one a round needed."""
    project = tiny_project(target_batch_size=240, round_timeout=60, group_size=group_size, **options)
    starts: list[RoundStart] = []
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        scheduled, carry_out = tracker.scheduler.open, backbone.execute

        def open_when_all_are_in(epoch, last_checkpoint):
            return scheduled(epoch, last_checkpoint) if len(tracker.members.live(epoch)) == PEERS else None

        def execute(project_id, outs):
            starts.extend(o.msg for o in outs if isinstance(o, Send) and isinstance(o.msg, RoundStart))
            carry_out(project_id, outs)

        tracker.scheduler.open, backbone.execute = open_when_all_are_in, execute
        peers = [await spawn_peer(backbone.url, project.id, f"p{i:02}", tmp_path) for i in range(PEERS)]
        try:
            for p in peers:
                await p.reached(EPOCHS, timeout=240)
            if ids is not None:  # (each process's peer id, by its name)
                ids.update({state.name: pid for pid, state in tracker.peers.items()})
        finally:
            await terminate(*peers)
        if checks is not None:
            checks += [tracker.audits.drawn, tracker.audits.caught]
    return peers, starts


def needed_links(starts: list[RoundStart]) -> dict[str, set[str]]:
    """Per member, whom the grouped rounds ``starts`` had it exchange with: its group, and
    as a slot reducer, that slot's reducers in the other groups."""
    needed: dict[str, set[str]] = {}
    for start in starts:
        assert start.groups is not None
        slots = start.groups.reducers
        for members, reducers in zip(start.groups.groups, slots, strict=True):
            for p in members:
                needed.setdefault(p, set()).update(q for q in members if q != p)
            for k, r in enumerate(reducers):
                needed[r].update(other[k] for other in slots if other[k] != r)
    return needed


def round_seconds(peers) -> float:
    return statistics.median(e["averaging_seconds"] for p in peers for e in p.epochs[:EPOCHS])


def assert_grouped_with_one_state(peers, starts) -> None:
    opened = {s.round_id: s for s in starts}.values()
    assert opened and all(s.groups is not None and len(s.groups.groups) == PEERS // GROUP_SIZE
                          for s in opened)
    for epoch in range(1, EPOCHS + 1):
        hashes = {e["state_sha256"] for p in peers for e in p.epochs if e["epoch"] == epoch}
        assert len(hashes) == 1, f"epoch {epoch}: {len(hashes)} states"


async def test_twelve_peers_in_groups_of_four_hold_one_state_with_few_links(tmp_path, report_figure):
    ids: dict[str, str] = {}
    peers, starts = await collaboration(tmp_path / "grouped", GROUP_SIZE, ids=ids)
    assert_grouped_with_one_state(peers, starts)
    # A member links to its group (3 others) and to the reducers of its slot in the two
    # other groups: 5, where a flat round of twelve links each to 11. Links outlive a
    # round only while used: those of an earlier plan (the backbone may regroup, or give
    # a member another slot, as links are measured anew) close when the next round starts.
    needed = needed_links(starts)
    for p in peers:
        for e in p.epochs[:EPOCHS]:
            assert set(e["paths"]) <= needed[ids[p.name]], (p.name, e["epoch"])
    most = max(len(e["paths"]) for p in peers for e in p.epochs[:EPOCHS])
    assert most <= GROUP_SIZE - 1 + PEERS // GROUP_SIZE - 1
    flat_peers, _ = await collaboration(tmp_path / "flat", None)
    flat_most = max(len(e["paths"]) for p in flat_peers for e in p.epochs[:EPOCHS])
    assert flat_most == PEERS - 1
    report_figure(f"{PEERS} peers, groups of {GROUP_SIZE}: at most {most} links a peer (flat: {flat_most}); "
                  f"a round averaged in {round_seconds(peers):.2f} s median (flat: "
                  f"{round_seconds(flat_peers):.2f} s), on loopback, 2 cores")


async def test_powersgd_rounds_in_groups_hold_one_state_and_check_out(tmp_path):
    """PowerSGD's two all-reduces each run in the groups: the same state on every peer, and
    every part of both phases at both levels checked, none wrong."""
    checks: list[int] = []
    peers, starts = await collaboration(tmp_path, GROUP_SIZE, checks, compression="powersgd",
                                        aggregation=AggregationSpec(verify_probability=1.0))
    assert_grouped_with_one_state(peers, starts)
    drawn, caught = checks
    assert drawn >= EPOCHS * 2 * (PEERS // GROUP_SIZE + 1) and caught == 0
    assert all(e["loss"] < peers[0].epochs[0]["loss"] for p in peers for e in p.epochs[EPOCHS - 1:EPOCHS])


async def test_a_slot_reducer_killed_as_its_round_begins_is_replaced_and_that_round_settles(
        tmp_path, report_figure):
    """SIGKILL a slot reducer as its grouped round starts: the backbone hands its slot to a
    member of its group, which reduces it there and finishes its pieces with the other
    groups' reducers of that slot; the same round settles (no redo), every survivor on one
    state, every part checked and none wrong, and the dead peer credited with nothing.
    Before it, every part at both levels of the grouped rounds all twelve took is rechecked
    by another peer before its round settles: the level-1 parts against what their reducers
    sent on."""
    project = tiny_project(target_batch_size=240, round_timeout=60, group_size=GROUP_SIZE,
                           aggregation=AggregationSpec(verify_probability=1.0))
    async with running_backbone(tmp_path, project) as backbone:
        tracker = backbone.trackers[project.id]
        scheduled = tracker.scheduler.open
        everyone = [PEERS]  # (all in before the first round: nobody downloads the state)

        def open_when_all_are_in(epoch, last_checkpoint):
            in_time = len(tracker.members.live(epoch)) >= everyone[0]
            return scheduled(epoch, last_checkpoint) if in_time else None

        tracker.scheduler.open = open_when_all_are_in
        peers = [await spawn_peer(backbone.url, project.id, f"p{i:02}", tmp_path) for i in range(PEERS)]

        def a_slot_reducer(start: RoundStart):
            if start.groups is None or not all(p.epoch >= 2 for p in peers):
                return None
            names = {p: s.name for p, s in tracker.peers.items()}
            shares = dict(zip(start.group, start.shares, strict=True))
            reducer = next(r for g in start.groups.reducers for r in g if shares[r] > 0)
            everyone[0] = PEERS - 1
            chosen.append(reducer)
            return next(p for p in peers if p.name == names.get(reducer))

        chosen: list[str] = []
        killed, recorded = kill_as_a_round_begins(backbone, a_slot_reducer)
        try:
            await until(lambda: killed, 240, "a grouped round past epoch 2")
            start, victim = killed[0]
            survivors = await survivors_step(tracker, peers, start, victim, project.round_timeout)
        finally:
            await terminate(*peers)
    step, credited = settled_without_a_redo(recorded, start, survivors)
    assert tracker.backups.reassigned >= 1
    assert len(credited) == PEERS - 1 and chosen[0] not in credited
    for epoch in (1, 2):
        hashes = {e["state_sha256"] for p in peers for e in p.epochs if e["epoch"] == epoch}
        assert len(hashes) == 1, f"epoch {epoch}: {len(hashes)} states"
    # Each of those rounds: a slot's part in each of the three groups at level 1, and its
    # pieces at level 2, at least (the LP may give every other slot, or piece, nothing).
    assert tracker.audits.drawn >= 2 * (PEERS // GROUP_SIZE + 1) and tracker.audits.caught == 0
    report_figure(f"slot reducer killed as grouped round {start.round_id} began: its backup took the slot, "
                  f"the round settled in {step.round_seconds:.1f} s (timeout {project.round_timeout} s), "
                  f"one state on {len(survivors)} survivors, {tracker.audits.drawn} parts checked, "
                  "none wrong")
