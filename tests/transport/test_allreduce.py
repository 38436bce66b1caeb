"""The butterfly all-reduce over real aiortc links on loopback."""

import asyncio

import pytest
import torch

from engine.averaging.allreduce import AveragingError, RoundPlan, butterfly_allreduce
from tests.transport.mesh_pair import make_meshes


async def _average(names, vectors, samples, shares, timeout=60.0, round_id=1):
    meshes = make_meshes(names)
    try:
        results = await asyncio.gather(*(
            butterfly_allreduce(RoundPlan(round_id, 4, names, shares, me), vectors[i] * samples[i],
                                samples[i], 2.0 * samples[i], meshes[me], timeout)
            for i, me in enumerate(names)
        ))
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    return results


@pytest.mark.parametrize("shares", [[1.0, 1.0, 1.0], [3.0, 0.5, 1.0]])
async def test_every_peer_gets_the_same_bits_of_the_sample_weighted_mean(shares):
    names = ["a", "b", "c"]
    vectors = [torch.randn(100_003) for _ in names]
    samples = [5, 11, 0]
    results = await _average(names, vectors, samples, shares)
    expected = (vectors[0] * 5 + vectors[1] * 11) / 16
    for r in results:
        assert torch.equal(r.vector, results[0].vector)
        assert r.samples == 16 and r.loss == pytest.approx(2.0)
    torch.testing.assert_close(results[0].vector, expected, rtol=1e-6, atol=1e-7)


async def test_a_solo_peer_averages_with_itself():
    (result,) = await _average(["solo"], [torch.arange(10.0)], [4], [1.0])
    torch.testing.assert_close(result.vector, torch.arange(10.0))


async def test_a_missing_peer_fails_the_round_within_its_timeout():
    names = ["a", "b", "gone"]
    meshes = make_meshes(["a", "b"], connect_timeout=30)
    meshes["gone"] = None
    try:
        with pytest.raises(AveragingError):
            await asyncio.gather(*(
                butterfly_allreduce(RoundPlan(1, 0, names, [1, 1, 1], me), torch.ones(30), 1, 1.0,
                                    meshes[me], timeout=3.0)
                for me in ("a", "b")
            ))
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values() if m))
