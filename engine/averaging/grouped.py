"""A grouped round as one member takes part in it: the exact two-level all-reduce that
engine/planning/groups.py plans, for rounds too large for every member to link to every
reducer.

Level 1 is a flat round within the member's group (engine/averaging/allreduce.py) whose
reducers are the group's slot reducers: slot k of every sender's vector goes to the
group's reducer of slot k, which reduces it to the group's sum. Before that result goes
out, the reducers of slot k in every group run level 2, a flat round among themselves on
their groups' sums (each finishes one piece of the slot, ``GroupedRound.pieces``); only
then does each send the finished slot back to its group. Every piece of the vector is
finished by one member and travels as the same bytes to everyone, so every member of
every group applies the same bits, as in a flat round.

A member links to its group and, as a reducer, to the other groups' reducers of its slot:
O(group size + groups) links, where a flat round needs one to every reducer.

A slot reducer lost midway is replaced by a backup of its group (the backbone's Reassign):
its group sends it the slot, and it stands in for the lost one at level 2
(``round_plan.stand_in``). Only a lost reducer whose group has nobody left to take its slot
fails the round, at once.

A level-2 sender is a reducer speaking for its group: its sample count is a claim like
any sender's, bounded as the round bounds one (a share of the target batch, the group's
caps), and the level-2 reducers check and aggregate the groups' sums with the project's
rule. Results carry the whole round's samples (``RoundPlan.grouped``): a member's
outcome takes the median of what its group's reducers say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

import torch

from engine.aio import abandon
from engine.averaging.allreduce import Finish, aggregate_parts, butterfly_allreduce
from engine.averaging.errors import AveragingError
from engine.averaging.grouped_commitment import grouped_commitment
from engine.averaging.round_plan import RoundPlan
from engine.averaging.tensor_parts import Averaged, ReducedPart, ReducedParts
from engine.transport.mesh import PeerMesh
from engine.wire.frames import Result

Outcome = TypeVar("Outcome", Averaged, ReducedParts)


async def grouped_allreduce(plan: RoundPlan, local_sum: torch.Tensor, samples: int,
                            loss_sum: float, mesh: PeerMesh, timeout: float) -> Averaged:
    """Average ``local_sum`` (gradient x samples, flat fp32) with every group's; raise
    AveragingError."""
    def level_one(one: RoundPlan, finish: Finish) -> Awaitable[Averaged]:
        return butterfly_allreduce(one, local_sum, samples, loss_sum, mesh, timeout, finish)

    return await _in_groups(plan, mesh, timeout, level_one)


async def grouped_aggregate(plan: RoundPlan, numel: int, mesh: PeerMesh, timeout: float) -> ReducedParts:
    """As an auxiliary member: reduce our group's slot of a ``numel``-element vector, finish
    it with the other groups' reducers of that slot, and send it back to our group."""
    def level_one(one: RoundPlan, finish: Finish) -> Awaitable[ReducedParts]:
        return aggregate_parts(one, numel, mesh, timeout, finish)

    return await _in_groups(plan, mesh, timeout, level_one)


async def _in_groups(plan: RoundPlan, mesh: PeerMesh, timeout: float,
                     level_one: Callable[[RoundPlan, Finish], Awaitable[Outcome]]) -> Outcome:
    """Our part of the round: level 1 in our group, and level 2 for each slot we reduce
    before its result goes back to the group; raise AveragingError."""
    grouped = plan.groups
    if grouped is None:
        raise AveragingError(f"round {plan.round_id} is not a grouped round")
    deadline = asyncio.get_running_loop().time() + timeout
    one = grouped.level_one(plan)
    level_two: list[tuple[RoundPlan, Averaged]] = []

    async def finish(j: int, group_part: ReducedPart) -> ReducedPart:
        two = grouped.level_two(plan, j)
        group_samples = group_part.result.samples
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            raise AveragingError(f"round {plan.round_id} ran out of time before its groups combined")
        total = await butterfly_allreduce(two, group_part.values * group_samples, group_samples,
                                          (group_part.result.loss or 0.0) * group_samples, mesh, left)
        level_two.append((two, total))
        return _finished(one, j, group_part, total)

    levels = asyncio.ensure_future(level_one(one, finish))
    watch = asyncio.ensure_future(_until_a_slot_is_orphaned(plan))
    try:
        await asyncio.wait([levels, watch], return_when=asyncio.FIRST_COMPLETED)
        if not levels.done():
            return watch.result()  # (raises)
        outcome = levels.result()
        if plan.verified:
            await asyncio.to_thread(_commit, plan, one, outcome, level_two)
        return outcome
    finally:
        abandon([levels, watch])


async def _until_a_slot_is_orphaned(plan: RoundPlan) -> NoReturn:
    """Raise once the backbone says a slot reducer of any group left and no backup took its
    slot: the slot cannot be finished, and members waiting on it through others would only
    learn at the deadline."""
    assert plan.groups is not None
    while True:
        lost = plan.changes.lost & {r for group in plan.groups.now(plan) for r in group}
        if lost:
            raise AveragingError(f"round {plan.round_id}: {', '.join(sorted(lost))} left with a slot to "
                                 "reduce, and no member of its group could take it over")
        await plan.changes.wait()


def _commit(plan: RoundPlan, one: RoundPlan, outcome: Averaged | ReducedParts,
            level_two: list[tuple[RoundPlan, Averaged]]) -> None:
    """(On a thread: it hashes the vector.) The round's commitment and what we reduced at
    either level, in place of level 1's."""
    reduced = outcome.reduced + [r for _, total in level_two for r in total.reduced]
    applied = outcome.vector if isinstance(outcome, Averaged) else torch.empty(0)
    outcome.commitment = grouped_commitment(plan, one, outcome.commitment, applied, reduced, level_two)
    outcome.reduced = reduced


def _finished(one: RoundPlan, j: int, group_part: ReducedPart, total: Averaged) -> ReducedPart:
    """Slot ``j`` as every group combined it, as it travels back to ours: the bytes we apply
    are the bytes they get."""
    values = total.vector  # (level 1's results travel as level 2 finished them: in fp32)
    result = Result(round_id=one.round_id, epoch=one.epoch, index=one.wire(j), samples=total.samples,
                    loss=total.loss, received=group_part.result.received)
    return ReducedPart(result, values.numpy().data, values)
