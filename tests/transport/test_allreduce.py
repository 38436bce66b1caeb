"""The butterfly all-reduce over real WebRTC links on loopback."""

import asyncio

import pytest
import torch

from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.compression import error_bound
from engine.averaging.errors import AveragingError
from engine.averaging.round_plan import RoundPlan
from engine.project import AggregationSpec
from engine.transport import backends
from engine.wire.frames import Part
from engine.wire.types import Transport
from tests.conftest import until
from tests.transport.mesh_pair import make_meshes, transports

# The reducer's weighted sum and the test's differ in fp32 rounding only: on values near
# zero made of terms of order 1-5, that is a few 1e-7 absolute (CI once saw 1.1e-7).
FP32_SUMS = 1e-6


async def _average(names, vectors, samples, shares, timeout=60.0, round_id=1, compression="none", moved=None,
                   pieces=1, stacks=None, links=None):
    """``moved``, if given, gets the bytes each peer sent; ``stacks``, the stacks each peer has;
    ``links``, the stack each peer's links ran on at its end."""
    meshes = make_meshes(names)
    for name, mine in (stacks or {}).items():
        meshes[name].transports = mine
    try:
        results = await asyncio.gather(*(
            butterfly_allreduce(RoundPlan(round_id, 4, names, shares, me, compression=compression,
                                          pieces=pieces),
                                vectors[i] * samples[i], samples[i], 2.0 * samples[i], meshes[me], timeout)
            for i, me in enumerate(names)
        ))
        if moved is not None:
            moved.extend(meshes[me].totals().bytes_sent for me in names)
        if links is not None:
            links.update({me: transports(meshes[me]) for me in names})
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    return results


@pytest.mark.parametrize(("shares", "pieces"),
                         [([1.0, 1.0, 1.0], 1), ([3.0, 0.5, 1.0], 1), ([3.0, 0.5, 1.0], 4)])
async def test_every_peer_gets_the_same_bits_of_the_sample_weighted_mean(shares, pieces):
    names = ["a", "b", "c"]
    vectors = [torch.randn(100_003) for _ in names]
    samples = [5, 11, 0]
    results = await _average(names, vectors, samples, shares, pieces=pieces)
    expected = (vectors[0] * 5 + vectors[1] * 11) / 16
    for r in results:
        assert torch.equal(r.vector, results[0].vector)
        assert r.samples == 16 and r.loss == pytest.approx(2.0)
        # c brought no samples, yet every reducer says it got its part: it took part.
        assert r.received == {"a": 5, "b": 11, "c": 0}
    torch.testing.assert_close(results[0].vector, expected, rtol=1e-6, atol=FP32_SUMS)


async def test_peers_on_different_stacks_apply_the_same_bits(monkeypatch):
    """A peer without the native stack averages with two that have it: its links run on
    aiortc at its end, theirs native between them, and every peer applies the same bits."""
    if backends.native_problem():
        pytest.skip(f"native stack unavailable here: {backends.native_problem()}")
    monkeypatch.setenv(backends.ENV, backends.AUTO)
    names = ["a", "b", "c"]
    vectors = [torch.randn(300_007) for _ in names]
    links: dict = {}
    results = await _average(names, vectors, [3, 4, 5], [1.0, 1.0, 1.0],
                             stacks={"c": [Transport.AIORTC]}, pieces=4, links=links)
    assert links["a"]["b"] is links["b"]["a"] is Transport.NATIVE
    assert links["c"] == {"a": Transport.AIORTC, "b": Transport.AIORTC}
    assert all(torch.equal(r.vector, results[0].vector) for r in results)
    expected = (vectors[0] * 3 + vectors[1] * 4 + vectors[2] * 5) / 12
    torch.testing.assert_close(results[0].vector, expected, rtol=1e-6, atol=FP32_SUMS)


async def test_compressed_rounds_move_fewer_bytes_and_every_peer_applies_the_same_bits():
    names = ["a", "b", "c"]
    vectors = [torch.randn(300_000) for _ in names]
    samples = [3, 5, 8]
    expected = sum(v * s for v, s in zip(vectors, samples, strict=True)) / 16
    moved = {}
    for method in ("none", "fp16", "uint8"):
        moved[method] = []
        results = await _average(names, vectors, samples, [1.0, 1.0, 1.0], compression=method,
                                 moved=moved[method])
        assert all(torch.equal(r.vector, results[0].vector) for r in results)
        # Each part is compressed twice (in, and the result out): both errors count.
        off = float((results[0].vector - expected).norm())
        assert off <= 3 * error_bound(expected, method) + 1e-4 * float(expected.norm())
    ratio = {m: sum(moved["none"]) / sum(moved[m]) for m in ("fp16", "uint8")}
    assert 1.9 < ratio["fp16"] <= 2.0 and 3.7 < ratio["uint8"] <= 4.0, ratio


async def test_a_sender_whose_sum_is_not_finite_costs_only_its_part_in_a_compressed_checked_round():
    names = ["a", "b", "c"]
    vectors = [torch.randn(50_000) for _ in names]
    vectors[2][::5] = float("nan")
    spec = AggregationSpec(verify_probability=1.0)
    meshes = make_meshes(names)
    try:
        results = await asyncio.gather(*(
            butterfly_allreduce(RoundPlan(1, 0, names, [1.0] * 3, me, aggregation=spec, compression="uint8"),
                                vectors[i] * 4, 4, 8.0, meshes[me], 60.0)
            for i, me in enumerate(names)))
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    assert all(torch.equal(r.vector, results[0].vector) for r in results)
    assert torch.isfinite(results[0].vector).all() and results[0].samples == 8  # c's part left out
    # Each member committed to what it applied, and they agree part by part.
    assert all(r.commitment.results == results[0].commitment.results for r in results)


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


@pytest.mark.parametrize("verify", [0.0, 0.5])
async def test_a_reducer_that_dies_mid_round_is_replaced_and_only_its_part_is_sent_again(verify):
    """c holds everyone's parts of its share when it dies. The backbone hands that part to
    a: b sends it once more, a reduces it too, and both apply the same average of their
    own gradients; nothing else crosses the links twice."""
    names = ["a", "b", "c"]
    vectors = {p: torch.randn(30_000) for p in names}
    samples = {"a": 2, "b": 6}
    meshes = make_meshes(names)
    spec = AggregationSpec(verify_probability=verify)
    plans = {me: RoundPlan(1, 0, names, [1.0, 1.0, 1.0], me, aggregation=spec) for me in ("a", "b")}
    try:
        rounds = [asyncio.ensure_future(butterfly_allreduce(plans[me], vectors[me] * samples[me], samples[me],
                                                            1.0 * samples[me], meshes[me], timeout=60.0))
                  for me in ("a", "b")]
        # c never reduces: it dies once both parts for it are in.
        await until(lambda: meshes["c"].mailbox.held("a")[0] and meshes["c"].mailbox.held("b")[0], 30,
                    "the parts for c to arrive")
        sent_before = meshes["b"].totals().bytes_sent
        await meshes["c"].close()
        for me in ("a", "b"):
            plans[me].changes.update(["c"], ["a", "b", "a"])
        results = await asyncio.gather(*rounds)
        resent = meshes["b"].totals().bytes_sent - sent_before
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    assert torch.equal(results[0].vector, results[1].vector)
    expected = (vectors["a"] * 2 + vectors["b"] * 6) / 8
    torch.testing.assert_close(results[0].vector, expected, rtol=1e-6, atol=FP32_SUMS)
    assert results[0].samples == 8 and results[0].received == {"a": 2, "b": 6}
    # c's part once more, and (unless it went out before c died) b's result to a; never
    # b's part for a again.
    part = 10_000 * 4
    assert part <= resent < 2 * part + 10_000, resent
    if verify:
        own, backup = results[0].commitment.reduced
        assert own.index == 0 and backup.index == 2 and [c.sender for c in backup.inputs] == ["a", "b"]
        assert [r.index for r in results[0].reduced] == [0, 2]


async def test_a_silent_member_on_probation_costs_the_round_only_a_short_grace():
    """A newcomer that never sends its part: the others average without it, promptly."""
    names = ["a", "b", "silent"]
    meshes = make_meshes(["a", "b"])
    meshes["silent"] = None
    plan = {me: RoundPlan(1, 0, names, [1.0, 1.0, 0.0], me, frozenset({"silent"})) for me in ("a", "b")}
    vectors = {"a": torch.randn(1000), "b": torch.randn(1000)}
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        results = await asyncio.gather(*(
            butterfly_allreduce(plan[me], vectors[me] * 3, 3, 3.0, meshes[me], timeout=60.0)
            for me in ("a", "b")))
        took = loop.time() - began
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values() if m))
    assert took < 10, f"the round waited {took:.1f}s for a member nobody waits for"
    for r in results:
        assert torch.equal(r.vector, results[0].vector) and r.samples == 6
        assert set(r.received) == {"a", "b"}
    torch.testing.assert_close(results[0].vector, (vectors["a"] + vectors["b"]) / 2)


async def test_an_optional_member_whose_part_comes_in_time_is_averaged_in():
    names = ["a", "b", "new"]
    shares = [1.0, 1.0, 0.0]
    vectors = [torch.randn(500) for _ in names]
    meshes = make_meshes(names)
    try:
        results = await asyncio.gather(*(
            butterfly_allreduce(RoundPlan(1, 0, names, shares, me, frozenset({"new"})), vectors[i] * 2, 2,
                                1.0, meshes[me], timeout=60.0)
            for i, me in enumerate(names)))
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    assert all(torch.equal(r.vector, results[0].vector) for r in results)
    torch.testing.assert_close(results[0].vector, sum(vectors) / 3)
    assert results[0].received == {"a": 2, "b": 2, "new": 2}


async def test_a_malformed_part_costs_its_sender_its_share_and_nobody_the_round():
    """``mallory`` sends both reducers a part of the wrong size: the honest peers finish
    the round without it, and only its contribution is missing."""
    names = ["a", "b", "mallory"]
    shares = [1.0, 1.0, 0.0]
    vectors = {"a": torch.randn(1000), "b": torch.randn(1000)}
    meshes = make_meshes(names)

    async def mallory():
        for j, reducer in enumerate(("a", "b")):
            link = await meshes["mallory"].link(reducer)
            await link.send(Part(round_id=1, epoch=0, index=j, samples=10**9, loss_sum=0.0), b"\0" * 12)

    try:
        honest = asyncio.gather(*(
            butterfly_allreduce(RoundPlan(1, 0, names, shares, me, frozenset({"mallory"})), vectors[me], 1,
                                1.0, meshes[me], timeout=60.0) for me in ("a", "b")))
        await mallory()
        results = await honest
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    for r in results:
        assert set(r.received) == {"a", "b"} and r.samples == 2
    torch.testing.assert_close(results[0].vector, (vectors["a"] + vectors["b"]) / 2)


async def test_a_link_that_dies_under_a_member_still_connected_fails_the_round_naming_it():
    """c's links close mid-round but the backbone never says c left (its NAT rebound, say):
    a and b give up within the short wait for the backbone's word, before the round's
    deadline, and name c, so the tracker keeps the pair apart instead of retrying it (a
    round that ran into its deadline while waiting named nobody)."""
    names = ["a", "b", "c"]
    meshes = make_meshes(names)
    loop = asyncio.get_running_loop()
    try:
        rounds = {me: asyncio.ensure_future(butterfly_allreduce(
            RoundPlan(1, 0, names, [1.0, 1.0, 1.0], me), torch.randn(30_000), 1, 1.0, meshes[me],
            timeout=8.0)) for me in ("a", "b")}
        await until(lambda: meshes["c"].mailbox.held("a")[0] and meshes["c"].mailbox.held("b")[0], 30,
                    "the parts for c to arrive")
        began = loop.time()
        await meshes["c"].close()
        for me, rnd in rounds.items():
            with pytest.raises(AveragingError) as failed:
                await rnd
            assert failed.value.suspects == ["c"], (me, failed.value)
        took = loop.time() - began
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    assert took < 6, f"the round waited {took:.1f}s for news of a member that never left"


async def test_a_reducer_takes_its_pieces_in_order_and_commits_to_each():
    """Shares in four pieces: each sender's pieces reach their reducer one after the other,
    every member applies the same bits, and in a checked project every member commits to
    each piece (the reducer to what it combined for each)."""
    names = ["a", "b"]
    vectors = {p: torch.randn(40_000) for p in names}
    spec = AggregationSpec(verify_probability=1.0)
    meshes = make_meshes(names)
    arrived: list[int] = []
    put = meshes["b"].mailbox.put

    def record(key, frame):
        if key.kind == "part":
            arrived.append(frame.header.index)
        put(key, frame)

    meshes["b"].mailbox.put = record
    try:
        results = await asyncio.gather(*(
            butterfly_allreduce(RoundPlan(1, 0, names, [1.0, 3.0], me, aggregation=spec, pieces=4),
                                vectors[me] * 2, 2, 1.0, meshes[me], 60.0) for me in names))
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    assert torch.equal(results[0].vector, results[1].vector)
    torch.testing.assert_close(results[0].vector, (vectors["a"] + vectors["b"]) / 2)
    assert arrived == [4, 5, 6, 7]  # a's pieces of b's share, in order
    for r in results:
        assert len(r.commitment.sent) == len(r.commitment.results) == 8
    assert [p.index for p in results[1].commitment.reduced] == [4, 5, 6, 7]


@pytest.mark.parametrize("stack", [Transport.NATIVE, Transport.AIORTC])
async def test_a_pipelined_round_stays_within_what_a_receiver_lets_a_peer_have_under_way(stack, monkeypatch):
    """Two peers, each reducing four pieces: a reducer's results and its own parts share one
    link, and the receiver drops a link with too many messages under way at once. Results go
    one at a time to each peer, so the round completes (10 MB reduced quickly once broke it)."""
    if stack is Transport.NATIVE and backends.native_problem():
        pytest.skip(f"native stack unavailable here: {backends.native_problem()}")
    monkeypatch.setenv(backends.ENV, stack.value)
    names = ["a", "b"]
    vectors = [torch.randn(2_500_000) for _ in names]
    links: dict = {}
    for round_id in (1, 2):
        results = await _average(names, vectors, [1, 1], [1.0, 1.0], pieces=4, round_id=round_id, links=links)
        assert torch.equal(results[0].vector, results[1].vector)
        torch.testing.assert_close(results[0].vector, (vectors[0] + vectors[1]) / 2, rtol=1e-6,
                                   atol=FP32_SUMS)
    assert links["a"]["b"] is stack
