"""Grouped rounds: the exact two-level all-reduce over real WebRTC links on loopback."""

import asyncio
from dataclasses import replace

import pytest
import torch

from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.errors import AveragingError
from engine.averaging.grouped import grouped_aggregate, grouped_allreduce
from engine.averaging.powersgd import Layout
from engine.averaging.powersgd_round import powersgd_allreduce
from engine.averaging.recheck import recheck
from engine.averaging.round_plan import GroupedRound, RoundPlan
from engine.planning.groups import plan_groups
from engine.planning.load_balancing import Member
from engine.planning.partition import part_bounds
from engine.project import AggregationSpec
from tests.transport.lost_reducer import BY_HAND, with_one_lost
from tests.transport.mesh_pair import make_meshes, transports
from tests.transport.test_allreduce import FP32_SUMS

MB = 2**20


def grouped_round(names: list[str], links: list[tuple[float, float]], group_size: int) -> GroupedRound:
    """The plan planning/groups.py makes for these links, in member ids."""
    plan = plan_groups([Member(up * MB, down * MB) for up, down in links], group_size, 4e6)
    return GroupedRound([[names[i] for i in g] for g in plan.groups],
                        [[names[i] for i in r] for r in plan.reducers], plan.slot_shares, plan.pieces)


NAMES = [f"p{i}" for i in range(8)]
LINKS = [(60, 300), (20, 100), (10, 50), (5, 20), (60, 300), (20, 100), (10, 50), (5, 20)]


def test_a_slot_covers_the_same_values_in_every_group():
    grouped = grouped_round(NAMES, LINKS, 4)
    assert len(grouped.groups) == 2 and grouped.slot_shares and len(grouped.reducers[0]) >= 2
    slots = []
    for group in grouped.groups:
        one = grouped.level_one(RoundPlan(7, 3, NAMES, [1.0] * 8, group[0]))
        reducers = len(grouped.reducers[0])
        assert one.group[:reducers] == grouped.reducers[grouped.group_of(group[0])]
        slots.append(part_bounds(100_003, one.shares, one.pieces)[:reducers])
    assert slots[0] == slots[1]
    two = grouped.level_two(RoundPlan(7, 3, NAMES, [1.0] * 8, grouped.reducers[1][0]), 0)
    assert two.group == [grouped.reducers[0][0], grouped.reducers[1][0]]
    assert two.wire(0) >= max(len(g) for g in grouped.groups)  # past every level-1 part
    shared = RoundPlan(7, 3, NAMES, [1.0] * 8, grouped.reducers[1][0],
                       aggregation=AggregationSpec(max_sample_share=0.5))
    assert grouped.level_two(shared, 0).aggregation.max_sample_share is None  # (it bounds one sender)


async def _rounds(names, vectors, samples, run, compression="none"):
    meshes = make_meshes(names)
    try:
        results = await asyncio.wait_for(asyncio.gather(*(
            run(RoundPlan(1, 4, names, [1.0] * len(names), me, compression=compression),
                vectors[i] * samples[i], samples[i], 2.0 * samples[i], meshes[me])
            for i, me in enumerate(names))), 120)
        links = {me: set(transports(meshes[me])) for me in names}
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    return results, links


@pytest.mark.parametrize("compression", ["none", "fp16"])
async def test_every_member_of_every_group_applies_the_same_bits_with_few_links(compression):
    grouped = grouped_round(NAMES, LINKS, 4)
    vectors = [torch.randn(60_001) for _ in NAMES]
    samples = [3, 5, 0, 7, 2, 4, 6, 1]

    async def grouped_run(plan, local_sum, n, loss_sum, mesh):
        return await grouped_allreduce(replace(plan, groups=grouped), local_sum, n, loss_sum, mesh, 90)

    results, links = await _rounds(NAMES, vectors, samples, grouped_run, compression)
    expected = sum(v * n for v, n in zip(vectors, samples, strict=True)) / sum(samples)
    for r in results:
        assert torch.equal(r.vector, results[0].vector)
        assert r.samples == sum(samples) and r.loss == pytest.approx(2.0)
    tolerance = {"none": (1e-6, FP32_SUMS), "fp16": (1e-2, 2e-3)}[compression]
    torch.testing.assert_close(results[0].vector, expected, rtol=tolerance[0], atol=tolerance[1])
    # A member links to its group, and a reducer to the reducers of its slot in other groups.
    groups = len(grouped.groups)
    for me, peers in links.items():
        g = grouped.group_of(me)
        mine = set(grouped.groups[g]) - {me}
        if me in grouped.reducers[g]:
            slot = grouped.reducers[g].index(me)
            mine |= {reducers[slot] for reducers in grouped.reducers} - {me}
        assert peers <= mine, (me, peers - mine)
    assert max(len(p) for p in links.values()) <= 4 - 1 + groups - 1 < len(NAMES) - 1


async def test_a_grouped_round_gives_what_the_flat_round_gives():
    grouped = grouped_round(NAMES, LINKS, 4)
    vectors = [torch.randn(30_007) for _ in NAMES]
    samples = [1, 2, 3, 4, 5, 6, 7, 8]

    async def grouped_run(plan, local_sum, n, loss_sum, mesh):
        return await grouped_allreduce(replace(plan, groups=grouped), local_sum, n, loss_sum, mesh, 90)

    async def flat_run(plan, local_sum, n, loss_sum, mesh):
        return await butterfly_allreduce(plan, local_sum, n, loss_sum, mesh, 90)

    by_groups, _ = await _rounds(NAMES, vectors, samples, grouped_run)
    flat, flat_links = await _rounds(NAMES, vectors, samples, flat_run)
    assert all(len(p) == len(NAMES) - 1 for p in flat_links.values())
    torch.testing.assert_close(by_groups[0].vector, flat[0].vector, rtol=1e-6, atol=FP32_SUMS)
    assert by_groups[0].samples == flat[0].samples == sum(samples)


def _completed_without(outcomes: dict, lost: int, slots: slice = slice(None)) -> None:
    """Seven members applied the same bits: in ``slots``, the average of the others' vectors."""
    assert len(outcomes) == 7
    averaged = list(outcomes.values())
    assert all(not isinstance(o, BaseException) for o in averaged), averaged
    assert all(torch.equal(o.vector, averaged[0].vector) for o in averaged)
    others = [i + 1 for i in range(8) if i != lost]
    expected = torch.full((20_000,), sum(others) / 7)
    torch.testing.assert_close(averaged[0].vector[slots], expected[slots])


async def test_a_sender_lost_midway_is_left_out_and_the_round_completes():
    outcomes, _ = await with_one_lost("h")
    _completed_without(outcomes, 7)
    assert outcomes["a"].samples == 14  # seven members' two samples each


async def test_a_backup_for_a_slot_reducer_that_had_finished_a_piece_fails_the_round_at_once(monkeypatch):
    """The lost reducer sent the other groups its piece of the slot before it died: the
    backup cannot finish that piece again (its group's sum lacks the lost one's gradient),
    so it gives the round up at once, and everyone hears of it, rather than wait until the
    deadline for parts nobody sends again."""
    outcomes, took = await with_one_lost("f", backup="g", dies_at_level_two=True, monkeypatch=monkeypatch,
                                          after_level_two=True)
    assert len(outcomes) == 7 and took < 20  # (the round's timeout is 60 s)
    # Its group fails; the other group got every slot before it died (the round settles on
    # its state, and the failed ones resync).
    assert all(isinstance(outcomes[p], AveragingError) for p in "egh"), outcomes
    assert "finished by its reducer before it left" in str(outcomes["g"])
    assert all(not isinstance(outcomes[p], BaseException) for p in "abcd"), outcomes


async def test_a_slot_reducer_lost_midway_without_a_backup_fails_the_round_at_once():
    outcomes, took = await with_one_lost("f")
    assert len(outcomes) == 7 and took < 20  # (the round's timeout is 60 s)
    assert all(isinstance(o, AveragingError) for o in outcomes.values()), outcomes


async def test_a_backup_takes_a_lost_slot_reducers_slot_in_its_group_and_across_groups():
    outcomes, took = await with_one_lost("f", backup="e")
    _completed_without(outcomes, 5)
    assert took < 20


async def test_a_backup_stands_in_for_a_slot_reducer_that_died_in_level_two(monkeypatch):
    outcomes, took = await with_one_lost("f", backup="g", dies_at_level_two=True, monkeypatch=monkeypatch)
    # Its slot, regathered by the backup, leaves it out; the other slot took its part before
    # it died (as a flat round keeps the parts a lost member's reducers had combined).
    _completed_without(outcomes, 5, slice(10_000, None))
    with_it = torch.full((10_000,), sum(range(1, 9)) / 8)
    without = torch.full((10_000,), (sum(range(1, 9)) - 6) / 7)
    slot_zero = outcomes["a"].vector[:10_000]
    assert torch.allclose(slot_zero, with_it) or torch.allclose(slot_zero, without)
    assert took < 20


async def test_a_powersgd_round_in_groups_gives_every_member_the_same_bits():
    """PowerSGD's two phases each run as a grouped round: every member applies the same
    step, the flat PowerSGD round's up to the order of fp32 sums."""
    names = [p for g in BY_HAND.groups for p in g]
    layout = Layout.of([(300, 200), (300,), (64, 32, 3, 3)], rank=4)
    g = torch.Generator().manual_seed(0)
    trend = torch.randn(layout.numel, generator=g)
    sums = {me: (trend + 0.3 * torch.randn(layout.numel, generator=g)) * (i + 1)
            for i, me in enumerate(names)}

    async def run(groups):
        meshes = make_meshes(names)
        try:
            return await asyncio.wait_for(asyncio.gather(*(
                powersgd_allreduce(RoundPlan(1, 3, names, [1.0] * 8, me, phases=2, groups=groups), sums[me],
                                   i + 1, 2.0 * (i + 1), meshes[me], 60, layout=layout, feedback=None, seed=1,
                                   allreduce=butterfly_allreduce if groups is None else grouped_allreduce)
                for i, me in enumerate(names))), 120)
        finally:
            await asyncio.gather(*(m.close() for m in meshes.values()))

    grouped, flat = await run(BY_HAND), await run(None)
    assert all(torch.equal(r.vector, grouped[0].vector) for r in grouped)
    assert grouped[0].samples == flat[0].samples == 36
    assert all(torch.equal(r.next_q[m], grouped[0].next_q[m]) for r in grouped for m in r.next_q)
    torch.testing.assert_close(grouped[0].vector, flat[0].vector, rtol=1e-4, atol=1e-4)


async def test_an_auxiliary_member_reduces_its_groups_slot_and_every_trainer_applies_the_same_bits():
    names = [p for g in BY_HAND.groups for p in g]
    trainers = [p for p in names if p != "b"]  # b: an auxiliary reducer of slot 1 in the first group
    vectors = {p: torch.randn(30_011) for p in trainers}
    meshes = make_meshes(names)

    def plan(me):
        return RoundPlan(5, 2, names, [1.0] * 8, me, auxiliary=frozenset({"b"}), groups=BY_HAND)

    try:
        done = await asyncio.wait_for(asyncio.gather(
            grouped_aggregate(plan("b"), 30_011, meshes["b"], 60),
            *(grouped_allreduce(plan(me), vectors[me] * 3, 3, 3.0, meshes[me], 60) for me in trainers)), 120)
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    auxiliary, averaged = done[0], done[1:]
    assert all(torch.equal(a.vector, averaged[0].vector) for a in averaged)
    assert averaged[0].samples == 3 * len(trainers)
    torch.testing.assert_close(averaged[0].vector, sum(vectors.values()) / len(trainers), rtol=1e-5,
                               atol=FP32_SUMS)
    assert auxiliary.received == {"a": 3, "c": 3, "d": 3}  # its group's senders, in full


@pytest.mark.parametrize(("phases", "codec"), [(1, "none"), (1, "fp16"), (1, "uint8"), (2, "none")])
async def test_a_checked_grouped_round_commits_what_a_checker_can_recombine(phases, codec):
    """Every part any member reduced, at either level (of either PowerSGD phase, in any
    codec), rechecks from the inputs and result it committed to; a level-1 part's check
    also finds the level-2 parts its reducer sent on; every member commits the same result
    for each piece it applied, the one its level-2 reducer shows a checker."""
    names = [p for g in BY_HAND.groups for p in g]
    layout = Layout.of([(300, 200), (300,), (64, 32, 3, 3)], rank=4)
    vectors = {p: torch.randn(layout.numel if phases == 2 else 20_011) for p in names}
    meshes = make_meshes(names)
    checked = AggregationSpec(verify_probability=1.0)

    def run(me):
        plan = RoundPlan(9, 2, names, [1.0] * 8, me, aggregation=checked, groups=BY_HAND, phases=phases,
                         compression=codec)
        if phases == 1:
            return grouped_allreduce(plan, vectors[me] * 2, 2, 2.0, meshes[me], 60)
        return powersgd_allreduce(plan, vectors[me] * 2, 2, 2.0, meshes[me], 60, layout=layout, feedback=None,
                                  seed=1, allreduce=grouped_allreduce)

    try:
        done = await asyncio.wait_for(asyncio.gather(*(run(me) for me in names)), 120)
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    commitments = dict(zip(names, (d.commitment for d in done), strict=True))
    indices = BY_HAND.indices(phases)
    assert all(len(c.results) == len(c.sent) == indices.count for c in commitments.values())
    for index in range(indices.level_two_offset(0), indices.count):  # the pieces, as applied
        assert len({c.results[index] for c in commitments.values()}) == 1
    for me, d in zip(names, done, strict=True):
        for r in d.reduced:
            place = indices.place(r.index)
            result = commitments[me].results[r.index]
            extra = {}
            if place.level == 1:
                first = indices.level_two_offset(place.slot) + place.phase * 2
                extra = {"forwarded": [commitments[me].sent[i] for i in range(first, first + 2)],
                         "pieces": BY_HAND.pieces[place.slot]}
            verdict = recheck(r.inputs, r.result, result, checked, 10**9, codec, reducer=me, **extra)
            assert verdict.ok, (me, r.index, verdict.reason)
            if place.level == 1:  # a reducer that sent on other values than its result is caught
                extra["forwarded"] = extra["forwarded"][::-1]
                assert not recheck(r.inputs, r.result, result, checked, 10**9, codec, reducer=me, **extra).ok
    assert sum(len(d.reduced) for d in done) == phases * (4 + 4)  # four slot reducers, at each level
