"""The tensor work of a round without a network: cutting the vector into parts, reducing a
part, landing results, committing to them, and what a round amounts to."""

import pytest
import torch

from engine.averaging import compression
from engine.averaging.recheck import part_digest, result_digest
from engine.averaging.round_plan import RoundPlan
from engine.averaging.seen import seen_by_reducers
from engine.averaging.tensor_parts import TensorPartContainer, TensorPartReducer, decode_values, outcome
from engine.project import AggregationSpec
from engine.wire.frames import Result

GROUP = ["a", "b", "c"]


def plan(me: str = "a", **options) -> RoundPlan:
    return RoundPlan(7, 3, GROUP, [1.0, 2.0, 1.0], me, **options)


def test_the_parts_cover_the_vector_and_travel_as_its_own_bytes():
    flat = torch.randn(1001)
    parts = TensorPartContainer(plan(), flat, samples=4)
    assert sum(parts.size(j) for j in range(3)) == 1001
    assert [parts.member_size(m) for m in range(3)] == [parts.size(j) for j in range(3)]
    assert parts.size(1) > parts.size(0), "the member with twice the share reduces more"
    pieces = [decode_values(bytearray(parts.payload(j)), parts.size(j), "none") for j in range(3)]
    assert torch.equal(torch.cat(pieces), flat)


def test_a_peer_without_samples_sends_empty_parts_that_decode_to_nothing():
    parts = TensorPartContainer(plan(), torch.zeros(100), samples=0)
    assert parts.payload(0) == b"" and parts.own(0) is None
    assert decode_values(parts.payload(0), parts.size(0), "none") is None


@pytest.mark.parametrize("method", ["none", "fp16"])
def test_a_payload_of_the_wrong_length_is_refused(method):
    good = TensorPartContainer(plan(compression=method), torch.randn(100), samples=1).payload(0)
    with pytest.raises(ValueError):
        decode_values(bytes(good)[:-2], 25, method)


def test_a_part_is_the_samples_weighted_mean_and_the_same_bits_whatever_the_arrival_order():
    sums = {p: torch.randn(50) * (i + 1) for i, p in enumerate(GROUP)}
    samples = {"a": 2, "b": 3, "c": 5}
    arrived = {p: (sums[p], samples[p], 1.5 * samples[p]) for p in GROUP}
    first = TensorPartReducer(plan()).reduce(0, arrived)
    second = TensorPartReducer(plan()).reduce(0, dict(reversed(list(arrived.items()))))
    expected = sum(sums.values()) / sum(samples.values())
    torch.testing.assert_close(first.values, expected)
    assert torch.equal(first.values, second.values)
    assert first.result.samples == 10 and first.result.received == samples
    assert first.result.loss == pytest.approx(1.5)


def test_a_sender_with_no_samples_is_seen_to_take_part_and_weighs_nothing():
    arrived = {"a": (torch.ones(10) * 4, 4, 8.0), "b": (None, 0, 0.0)}
    done = TensorPartReducer(plan()).reduce(0, arrived)
    assert done.result.received == {"a": 4, "b": 0}
    assert torch.equal(done.values, torch.ones(10))


def test_a_part_that_is_not_finite_is_left_out_and_costs_only_its_sender():
    arrived = {"a": (torch.ones(10) * 2, 2, 2.0), "b": (torch.full((10,), float("nan")), 2, 2.0),
               "c": (torch.ones(10) * 6, 2, 2.0)}
    done = TensorPartReducer(plan()).reduce(0, arrived)
    assert set(done.result.received) == {"a", "c"}
    assert torch.equal(done.values, torch.full((10,), 2.0))


def test_nothing_to_reduce_is_an_error_not_a_result():
    with pytest.raises(ValueError, match="no part to reduce"):
        TensorPartReducer(plan()).reduce(0, {"a": (None, 0, 0.0)})


def test_a_compressed_result_is_applied_by_its_reducer_as_everyone_decodes_it():
    arrived = {p: (torch.randn(64), 1, 1.0) for p in GROUP}
    done = TensorPartReducer(plan(compression="uint8")).reduce(0, arrived)
    assert torch.equal(done.values, compression.decode(done.payload, 64, "uint8"))


def test_in_a_checked_project_everything_done_is_committed_to():
    checked = plan(aggregation=AggregationSpec(verify_probability=0.5))
    flat = torch.randn(40)
    parts = TensorPartContainer(checked, flat, samples=2)
    reducer = TensorPartReducer(checked)
    payload = parts.payload(1)
    parts.commit_sent(1, payload)
    assert parts.sent[1] == part_digest(2, parts.own(1))
    mine = reducer.reduce(0, {"a": (parts.own(0), 2, 1.0), "b": (torch.randn(parts.size(0)), 1, 1.0)})
    parts.land(0, mine.values)
    theirs = torch.randn(parts.size(1))
    parts.land(1, theirs)
    commitment = parts.commitment(reducer.reduced)
    assert commitment.sent[1] == parts.sent[1]
    assert commitment.results[:2] == [result_digest(mine.values), result_digest(theirs)]
    (inputs,) = commitment.reduced
    assert inputs.index == 0 and [c.sender for c in inputs.inputs] == ["a", "b"]
    assert inputs.inputs[0].sha256 == part_digest(2, parts.own(0))


def test_the_round_counts_what_most_reducers_say_whatever_one_of_them_claims():
    parts = TensorPartContainer(plan(), torch.randn(30), samples=1)
    reducer = TensorPartReducer(plan())
    honest = reducer.reduce(0, {p: (torch.randn(parts.size(0)), 2, 2.0) for p in GROUP}).result
    liar = honest.__class__(round_id=7, epoch=3, index=1, samples=10**9, loss=0.0,
                            received={"a": 2, "b": 2, "c": 10**9})
    averaged = outcome([honest, liar, honest], parts, reducer)
    assert averaged.samples == 6 and averaged.loss == pytest.approx(1.0)
    assert averaged.received == {"a": 2, "b": 2, "c": 2}
    with pytest.raises(ValueError):
        outcome([], parts, reducer)


def test_a_step_counts_a_sender_its_reducers_disagree_on_as_the_backbone_credits_it():
    """One reducer set a part aside (or got it late), the other took it: the step's samples
    are what the ledger credits the senders, whichever of them holds more of the vector."""
    for shares, counted in (([0.49, 0.51], 40 + 56), ([0.51, 0.49], 40)):
        two = RoundPlan(7, 3, ["a", "b"], shares, "a")
        parts = TensorPartContainer(two, torch.randn(100), samples=40)
        aside = Result(round_id=7, epoch=3, index=0, samples=40, loss=1.0, received={"a": 40, "b": 0})
        took = Result(round_id=7, epoch=3, index=1, samples=96, loss=1.0, received={"a": 40, "b": 56})
        averaged = outcome([aside, took], parts, TensorPartReducer(two))
        reports = {"a": aside.received, "b": took.received}
        credited = seen_by_reducers(reports, {"a": shares[0], "b": shares[1]})
        assert averaged.samples == sum(credited.values()) == counted


def test_a_reducer_holding_most_of_the_vector_cannot_count_a_sender_past_its_cap():
    two = RoundPlan(7, 3, ["a", "b"], [0.4, 0.6], "a", caps={"a": 48, "b": 64})
    parts = TensorPartContainer(two, torch.randn(100), samples=40)
    honest = Result(round_id=7, epoch=3, index=0, samples=96, loss=1.0, received={"a": 40, "b": 56})
    liar = Result(round_id=7, epoch=3, index=1, samples=10**9, loss=1.0, received={"a": 40, "b": 10**9})
    assert outcome([honest, liar], parts, TensorPartReducer(two)).samples == 40 + 64
