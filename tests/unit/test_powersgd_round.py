"""A PowerSGD round's two phases (engine/averaging/powersgd_round.py) in one process: the
mesh is stood in for by ``Simulated``, which reduces each part of each phase once, with its
owner's TensorPartReducer (the same checks, the same order), and lands every result on
every sender -- what AllReduceRunner does over links (tests/transport/test_powersgd.py runs
the same over real links)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
import torch

from engine.averaging import tensor_parts
from engine.averaging.errors import AveragingError
from engine.averaging.powersgd import Layout, bases, decompress, project, rademacher, sketch, starting_q
from engine.averaging.powersgd_round import aggregate_phases, powersgd_allreduce
from engine.averaging.recheck import recheck
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import (
    Averaged,
    ReducedParts,
    TensorPartContainer,
    TensorPartReducer,
    outcome,
)
from engine.project import AggregationSpec

SHAPES = [(40, 30), (40,), (24, 6, 3, 3), (7,)]
SEED = 5


@dataclass
class Phase:
    members: dict = field(default_factory=dict)  # me -> (plan, container, loss_sum)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    out: dict = field(default_factory=dict)


class Simulated:
    """The mesh of one process: a phase is reduced once every member expected in it has
    come (a member lost after phase P is not expected in phase Q)."""

    def __init__(self, lost_after_p: frozenset[str] = frozenset()) -> None:
        self.phases: dict[tuple[int, int], Phase] = {}
        self.lost_after_p = lost_after_p

    async def allreduce(self, plan, vector, samples, loss_sum, mesh, timeout) -> Averaged:
        if plan.phase == 1 and plan.me in self.lost_after_p:
            raise AveragingError(f"round {plan.round_id}: {plan.me} lost its connection")
        container = TensorPartContainer(plan, vector.contiguous().view(-1), samples)
        return await self._join(plan, container, loss_sum)

    async def aggregate(self, plan, numel, mesh, timeout) -> ReducedParts:
        return await self._join(plan, TensorPartContainer(plan, None, 0, numel), 0.0)

    async def _join(self, plan, container, loss_sum):
        phase = self.phases.setdefault((plan.round_id, plan.phase), Phase())
        phase.members[plan.me] = (plan, container, loss_sum)
        expected = {m for m in plan.group if not (plan.phase == 1 and m in self.lost_after_p)}
        if set(phase.members) == expected:
            self._reduce(phase)
            phase.done.set()
        await asyncio.wait_for(phase.done.wait(), 10)
        return phase.out[plan.me]

    @staticmethod
    def _reduce(phase: Phase) -> None:
        members = phase.members
        plan = next(iter(members.values()))[0]
        reducers = {me: TensorPartReducer(p) for me, (p, _, _) in members.items()}
        results: dict[str, list] = {me: [] for me in members}
        for j in range(plan.parts):
            owner = plan.owner(j)
            if owner not in members:  # lost: the backbone handed its parts to a backup (Reassign)
                owner = next(m for m in plan.group if m in members and m not in plan.auxiliary)
            if members[owner][1].size(j) == 0:
                continue
            owned = members[owner][1]
            parts = {}
            for me in plan.group:  # (AllReduceRunner hands them over in any order; reduce sorts)
                if me not in members or not members[me][1].sends:
                    continue
                _, c, loss = members[me]
                if plan.verified and me != owner:
                    c.commit_sent(j, c.payload(j))
                    c.shown[j] = owned.own_digest(j)
                parts[me] = (c.own(j), c.samples, loss)
            done = reducers[owner].reduce(j, parts)
            for me, (_, c, _) in members.items():
                if c.sends:
                    c.land(j, done.values)
                    results[me].append(done.result)
        for me, (_, c, _) in members.items():
            r = reducers[me]
            phase.out[me] = (outcome(results[me], c, r) if c.sends else
                             ReducedParts(r.mine, r.seen_in_all(), c.commitment(r.reduced), r.reduced))


def plans(names, spec=None, auxiliary=(), shares=None, pieces=1):
    shares = shares or [1.0] * len(names)
    return {me: RoundPlan(9, 4, names, shares, me, aggregation=spec or AggregationSpec(), phases=2,
                          auxiliary=frozenset(auxiliary), pieces=pieces)
            for me in names}


def inputs(layout, names, samples, seed=0):
    g = torch.Generator().manual_seed(seed)
    trend = torch.randn(layout.numel, generator=g)
    return {me: (trend + 0.2 * torch.randn(layout.numel, generator=g)) * n
            for me, n in zip(names, samples, strict=True)}


async def run_round(names, samples, *, spec=None, feedback=None, sim=None, auxiliary=(), layout=None,
                    pieces=1, shares=None, warm=None):
    layout = layout or Layout.of(SHAPES, rank=2)
    sim = sim or Simulated()
    trainers = [n for n in names if n not in auxiliary]
    sums = inputs(layout, trainers, samples)
    all_plans = plans(names, spec, auxiliary, shares, pieces)
    feedback = feedback or {}

    async def member(me):
        if me in auxiliary:
            return await aggregate_phases(all_plans[me], layout, None, 30.0, aggregate=sim.aggregate)
        i = trainers.index(me)
        return await powersgd_allreduce(all_plans[me], sums[me], samples[i], 1.5 * samples[i], None, 30.0,
                                        layout=layout, feedback=feedback.get(me), seed=SEED, warm=warm,
                                        allreduce=sim.allreduce)

    done = await asyncio.gather(*(member(me) for me in names), return_exceptions=True)
    return dict(zip(names, done, strict=True)), sums, layout


async def test_every_member_applies_the_same_bits_and_they_are_the_steps_math():
    names, samples = ["a", "b", "c"], [3, 5, 8]
    out, sums, layout = await run_round(names, samples, shares=[3.0, 0.5, 1.0], pieces=2)
    steps = [out[me].vector for me in names]
    assert all(torch.equal(s, steps[0]) for s in steps)
    # The same as the math alone: the phases' averages, P^ and the step.
    q0 = rademacher(layout, SEED, 4)
    total = sum(samples)
    p_avg = sum(sketch(layout, sums[me], q0) for me in names) / total
    basis = bases(layout, p_avg)
    q_avg = sum(project(layout, sums[me], basis) for me in names) / total
    torch.testing.assert_close(steps[0], decompress(layout, p_avg, basis, q_avg), rtol=1e-4, atol=1e-5)
    first = out["a"]
    assert first.samples == total and first.received == {"a": 3, "b": 5, "c": 8}
    assert first.phase_numel == [layout.p_numel, layout.q_numel]


async def test_a_checked_round_commits_to_both_phases_under_their_own_indices():
    names = ["a", "b", "c"]
    out, _, _ = await run_round(names, [2, 2, 2], spec=AggregationSpec(verify_probability=1.0))
    parts = len(names)
    for me in names:
        c = out[me].commitment
        assert len(c.sent) == len(c.results) == len(c.shown) == 2 * parts
        mine = names.index(me)
        assert [p.index for p in c.reduced] == [mine, parts + mine]
        assert sorted(r.index for r in out[me].reduced) == [mine, parts + mine]
        assert all(d is not None for j, d in enumerate(c.sent) if j % parts != mine)
    # Members applied the same results, part by part, in both phases.
    assert all(out[me].commitment.results == out["a"].commitment.results for me in names)


@pytest.mark.parametrize("lying_phase", [0, 1])
async def test_a_reducer_lying_in_one_phase_is_found_wrong_there_and_only_there(monkeypatch, lying_phase):
    honest = tensor_parts.TensorPartReducer.combine

    def combine(self, contributions):
        combined, committed = honest(self, contributions)
        if self.plan.me == "b" and self.plan.phase == lying_phase:
            combined.values.mul_(-3.0)
        return combined, committed

    monkeypatch.setattr(tensor_parts.TensorPartReducer, "combine", combine)
    spec = AggregationSpec(verify_probability=1.0)
    names = ["a", "b", "c"]
    out, _, _ = await run_round(names, [4, 4, 4], spec=spec)
    assert all(torch.equal(out[me].vector, out["a"].vector) for me in names)  # everyone took the lie
    verdicts = {}
    for reduced in out["b"].reduced:
        applied = out["a"].commitment.results[reduced.index]
        verdicts[reduced.index] = recheck(reduced.inputs, reduced.result, applied, spec, 10**9).ok
    lied = lying_phase * len(names) + 1
    assert verdicts == {1: lied != 1, 4: lied != 4}


async def test_a_member_lost_between_the_phases_is_left_out_of_phase_q_and_the_rest_agree():
    names = ["a", "b", "c"]
    out, _, _ = await run_round(names, [4, 4, 4], sim=Simulated(lost_after_p=frozenset({"c"})),
                                spec=AggregationSpec(verify_probability=1.0))
    assert isinstance(out["c"], AveragingError)
    assert torch.equal(out["a"].vector, out["b"].vector)
    assert "c" not in out["a"].received  # seen in phase P only: not in full
    # Its phase-Q part went to a backup ("a"), which reduced it under the part's own index.
    assert sorted(r.index for r in out["a"].reduced) == [0, 3, 5]


async def test_a_member_without_samples_keeps_all_it_has_for_the_next_round():
    names = ["a", "b", "c"]  # (c reduces too: a and b's parts judge each other)
    layout = Layout.of(SHAPES, rank=2)
    carried = torch.randn(layout.numel)
    out, _, _ = await run_round(names, [4, 4, 0], feedback={"c": carried}, layout=layout)
    assert out["c"].received == {"a": 4, "b": 4, "c": 0} or out["c"].received == {}
    # c brought no samples: it sent header-only parts, so nothing of its M went out.
    assert torch.equal(out["c"].residual, carried)


async def test_alone_with_a_member_that_brought_no_samples_a_part_is_never_taken_unjudged():
    """That member reduces a share, and has nothing of its own to judge the other's part by:
    it sets it aside and the round fails (it is redone once both computed), rather than
    letting one sender's word move the model."""
    out, _, _ = await run_round(["a", "b"], [4, 0])
    assert all(isinstance(out[me], Exception) for me in ("a", "b")), out
    assert any("no part to reduce" in str(out[me]) for me in ("a", "b")), out


async def test_error_feedback_is_what_each_members_own_compression_left_out():
    names = ["a", "b"]
    out, sums, layout = await run_round(names, [4, 4])
    for me in names:
        left_out = out[me].residual
        for part in layout.plain:  # values that travelled whole leave nothing behind
            assert not left_out[part.offset:part.offset + part.numel].any()
    # What the step moved, times the samples, plus what was left out, is what was brought.
    torch.testing.assert_close(out["a"].vector * 8 + out["a"].residual + out["b"].residual,
                               sums["a"] + sums["b"], rtol=1e-4, atol=1e-3)


async def test_an_auxiliary_member_reduces_its_parts_of_both_phases_and_applies_nothing():
    names = ["a", "b", "x"]
    spec = AggregationSpec(verify_probability=1.0)
    out, _, layout = await run_round(names, [4, 6], spec=spec, auxiliary=("x",), shares=[1.0, 1.0, 2.0])
    aux = out["x"]
    assert isinstance(aux, ReducedParts) and aux.phase_numel == [layout.p_numel, layout.q_numel]
    assert sorted(r.index for r in aux.results) == [2, 5]
    assert aux.received == {"a": 4, "b": 6}
    assert [p.index for p in aux.commitment.reduced] == [2, 5] and aux.commitment.sent == []
    assert torch.equal(out["a"].vector, out["b"].vector)


async def test_every_member_carries_the_same_average_q_to_the_next_round_which_starts_from_it():
    names, samples = ["a", "b", "c"], [3, 5, 8]
    out, _, layout = await run_round(names, samples)
    carried = out["a"].next_q
    assert sorted(carried) == [mat.param for mat in layout.matrices] == [0, 2]
    for me in names[1:]:
        assert all(torch.equal(out[me].next_q[i], q) for i, q in carried.items())
    warm = [carried[mat.param] for mat in layout.matrices]
    again, sums, _ = await run_round(names, samples, warm=warm)
    q0 = starting_q(layout, warm, SEED, 4)
    assert not torch.equal(q0[0], rademacher(layout, SEED, 4)[0])
    total = sum(samples)
    p_avg = sum(sketch(layout, sums[me], q0) for me in names) / total
    basis = bases(layout, p_avg)
    q_avg = sum(project(layout, sums[me], basis) for me in names) / total
    expected = decompress(layout, p_avg, basis, q_avg)
    torch.testing.assert_close(again["b"].vector, expected, rtol=1e-4, atol=1e-5)


class Poisoning(Simulated):
    """Member "d" sends its phase ``phase`` vector as ``poison`` makes it."""

    def __init__(self, phase: int, poison) -> None:
        super().__init__()
        self.phase, self.poison = phase, poison

    async def allreduce(self, plan, vector, samples, loss_sum, mesh, timeout) -> Averaged:
        if plan.me == "d" and plan.phase == self.phase:
            vector = self.poison(vector)
        return await super().allreduce(plan, vector, samples, loss_sum, mesh, timeout)


POISONED = {"NaN": lambda v: torch.full_like(v, float("nan")), "x(-1e4)": lambda v: v * -1e4}


@pytest.mark.parametrize("poison", POISONED)
@pytest.mark.parametrize("phase", [0, 1], ids=["phase P", "phase Q"])
async def test_a_poisoned_part_in_either_phase_is_left_out_by_its_reducer_and_costs_its_sender_only(
        phase, poison):
    """The reducers' screens run on each part of each phase: a NaN part, or one 10^4 times
    the median length, is left out; the others apply one finite step close to their own
    average, and the sender is credited nothing (seen in full in neither phase)."""
    names, samples = ["a", "b", "c", "d"], [4, 4, 4, 4]
    clean, _, _ = await run_round(names, samples)
    out, _, _ = await run_round(names, samples, sim=Poisoning(phase, POISONED[poison]))
    step, unpoisoned = out["a"].vector, clean["a"].vector
    assert all(torch.equal(out[me].vector, step) for me in "abc") and bool(torch.isfinite(step).all())
    assert all("d" not in out[me].received for me in "abc")
    # (its members share a trend: without d's honest part the step is nearly the same)
    cosine = float(step @ unpoisoned / (step.norm() * unpoisoned.norm()))
    assert cosine > 0.95 and step.norm() <= 1.2 * unpoisoned.norm(), (cosine, step.norm(), unpoisoned.norm())
