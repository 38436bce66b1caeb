"""Auxiliary members in the butterfly all-reduce, over real aiortc links on loopback: a peer
that brings no gradient reduces its part for the trainers and takes no step."""

import asyncio

import pytest
import torch

from engine.averaging.allreduce import aggregate_parts, butterfly_allreduce
from engine.averaging.compression import encoded_size
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import ReducedParts
from engine.project import AggregationSpec
from tests.conftest import until
from tests.transport.mesh_pair import make_meshes

TRAINERS = ["a", "b", "c"]


def plan(me: str, group: list[str], shares: list[float], **kw) -> RoundPlan:
    return RoundPlan(1, 0, group, shares, me, auxiliary=frozenset({"aux"}), **kw)


@pytest.mark.parametrize("compression", ["none", "uint8"])
async def test_trainers_apply_the_same_average_an_auxiliary_member_helped_reduce(compression):
    group = [*TRAINERS, "aux"]
    shares = [0.1, 0.1, 0.0, 0.8]  # c reduces nothing: it only sends; aux reduces most
    numel = 40_000
    vectors = {p: torch.randn(numel) for p in TRAINERS}
    samples = {"a": 2, "b": 3, "c": 5}
    spec = AggregationSpec(verify_probability=1.0)
    meshes = make_meshes(group)
    try:
        outcomes = await asyncio.gather(
            *(butterfly_allreduce(plan(me, group, shares, aggregation=spec, compression=compression),
                                  vectors[me] * samples[me], samples[me], 1.5 * samples[me], meshes[me], 60.0)
              for me in TRAINERS),
            aggregate_parts(plan("aux", group, shares, aggregation=spec, compression=compression), numel,
                            meshes["aux"], 60.0))
        aux_sent = meshes["aux"].totals().bytes_sent
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    *trained, aux = outcomes
    assert isinstance(aux, ReducedParts)
    for outcome in trained:
        assert torch.equal(outcome.vector, trained[0].vector)
        assert outcome.samples == 10 and outcome.loss == pytest.approx(1.5)
    expected = sum(vectors[p] * samples[p] for p in TRAINERS) / 10
    tolerance = 1e-5 if compression == "none" else 0.05
    torch.testing.assert_close(trained[0].vector, expected, rtol=tolerance, atol=tolerance)
    # The auxiliary member saw every trainer's part, and reduced 80% of the vector.
    assert aux.received == samples
    (result,) = aux.results
    assert result.index == 3 and result.samples == 10
    part = int(0.8 * numel)
    assert aux.bytes_in == 3 * encoded_size(part, compression)
    # It sent each trainer its result and nothing else (no part of its own).
    assert 3 * encoded_size(part, compression) <= aux_sent < 3.3 * encoded_size(part, compression)
    # It committed to what it combined, and the trainers to the result they applied.
    assert [c.sender for c in aux.commitment.inputs_of(3)] == TRAINERS
    assert len({o.commitment.results[3] for o in trained}) == 1


async def test_an_auxiliary_member_reduces_without_a_trainer_that_died_midway():
    """b dies holding the parts of its share: the backbone hands them to a, and tells
    everyone b is lost. The auxiliary member stops waiting for b's part and reduces its own
    from a and c; both apply the average of their own gradients."""
    group = ["a", "b", "c", "aux"]
    shares = [0.25, 0.25, 0.25, 0.25]
    numel = 20_000
    vectors = {p: torch.randn(numel) for p in ("a", "c")}
    meshes = make_meshes(group)
    plans = {me: plan(me, group, shares) for me in ("a", "c", "aux")}
    try:
        rounds = [asyncio.ensure_future(
            butterfly_allreduce(plans[me], vectors[me] * 2, 2, 2.0, meshes[me], 60.0)) for me in ("a", "c")]
        aux = asyncio.ensure_future(aggregate_parts(plans["aux"], numel, meshes["aux"], 60.0))
        await until(lambda: meshes["b"].mailbox.held("a")[0] and meshes["b"].mailbox.held("c")[0], 30,
                    "the parts for b to arrive")
        await meshes["b"].close()
        for p in plans.values():
            p.changes.update(["b"], ["a", "a", "c", "aux"])
        results = await asyncio.gather(*rounds)
        aggregated = await aux
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    assert torch.equal(results[0].vector, results[1].vector)
    torch.testing.assert_close(results[0].vector, (vectors["a"] + vectors["c"]) / 2)
    assert [r.index for r in aggregated.results] == [3]
    assert aggregated.received == {"a": 2, "c": 2}
