"""PowerSGD rounds over real WebRTC links on loopback (engine/averaging/powersgd_round.py
over engine/averaging/allreduce.py): the same bits on every peer, the bytes the
compression saves, a missing member (a reducer's lie in either phase: tests/unit/
test_powersgd_round.py in one process, tests/hostile/test_powersgd.py between processes)."""

import asyncio

import pytest
import torch

from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.errors import AveragingError
from engine.averaging.powersgd import Layout
from engine.averaging.powersgd_round import powersgd_allreduce
from engine.averaging.round_plan import RoundPlan
from engine.project import AggregationSpec
from tests.transport.mesh_pair import make_meshes

SHAPES = [(300, 200), (300,), (64, 32, 3, 3), (17,)]


async def _powersgd(names, samples, *, spec=None, pieces=1, shares=None, feedback=None, timeout=60.0,
                    absent=(), moved=None):
    """Each present member's round (or its error); ``moved``, if given, gets the bytes each sent."""
    layout = Layout.of(SHAPES, rank=4)
    g = torch.Generator().manual_seed(0)
    trend = torch.randn(layout.numel, generator=g)
    sums = {me: (trend + 0.3 * torch.randn(layout.numel, generator=g)) * n
            for me, n in zip(names, samples, strict=True)}
    meshes = make_meshes(names)
    try:
        done = await asyncio.gather(*(
            powersgd_allreduce(RoundPlan(1, 3, names, shares or [1.0] * len(names), me,
                                         aggregation=spec or AggregationSpec(), pieces=pieces, phases=2),
                               sums[me], n, 2.0 * n, meshes[me], timeout, layout=layout,
                               feedback=(feedback or {}).get(me), seed=1)
            for me, n in zip(names, samples, strict=True) if me not in absent), return_exceptions=True)
        if moved is not None:
            moved.extend(meshes[me].totals().bytes_sent for me in names)
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    return done, sums, layout


@pytest.mark.parametrize(("shares", "pieces"), [([1.0, 1.0, 1.0], 1), ([3.0, 0.5, 1.0], 4)])
async def test_every_peer_applies_the_same_bits_of_both_phases(shares, pieces):
    done, _, layout = await _powersgd(["a", "b", "c"], [5, 11, 0], shares=shares, pieces=pieces)
    assert all(torch.equal(r.vector, done[0].vector) for r in done)
    assert all(r.samples == 16 and r.received == {"a": 5, "b": 11, "c": 0} for r in done)
    assert all(r.phase_numel == [layout.p_numel, layout.q_numel] for r in done)


async def test_a_powersgd_round_moves_about_the_compression_ratio_fewer_bytes():
    names, samples = ["a", "b", "c"], [3, 5, 8]
    moved: list[int] = []
    _, sums, layout = await _powersgd(names, samples, moved=moved)
    plain: list[int] = []
    meshes = make_meshes(names)
    try:
        await asyncio.gather(*(
            butterfly_allreduce(RoundPlan(2, 3, names, [1.0] * 3, me), sums[me], n, 2.0 * n, meshes[me], 60.0)
            for me, n in zip(names, samples, strict=True)))
        plain.extend(meshes[me].totals().bytes_sent for me in names)
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    ratio = sum(plain) / sum(moved)
    expected = layout.numel / (layout.p_numel + layout.q_numel)
    assert 0.6 * expected < ratio <= expected, (ratio, expected)  # (frame headers aside)


async def test_a_missing_member_fails_both_phases_within_the_timeout():
    done, _, _ = await _powersgd(["a", "b", "c"], [4, 4, 4], timeout=3.0, absent=("c",))
    assert all(isinstance(r, AveragingError) and "c" in r.suspects for r in done)
