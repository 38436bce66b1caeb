"""A grouped round on real WebRTC links on loopback in which a member is lost midway and
the backbone's word (Reassign) reaches the others by hand, as backbone/tracker/backups.py
would send it: two groups of four, two slot reducers each, the other two send only."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import torch

from engine.averaging import grouped
from engine.averaging.allreduce import butterfly_allreduce
from engine.averaging.grouped import grouped_allreduce
from engine.averaging.round_plan import GroupedRound, RoundChanges, RoundPlan
from engine.transport.mesh import PeerMesh
from tests.transport.mesh_pair import make_meshes

BY_HAND = GroupedRound([["a", "b", "c", "d"], ["e", "f", "g", "h"]], [["a", "b"], ["e", "f"]], [0.5, 0.5],
                       [[0.5, 0.5], [0.5, 0.5]])
NAMES = [p for g in BY_HAND.groups for p in g]
LEVEL_ONE_PARTS = len(NAMES)  # (the level-2 plans' parts come after)

# At level 2, given its plan and mesh, before it runs the protocol: what a member does
# besides (an adversary's act).
LevelTwoHook = Callable[[RoundPlan, PeerMesh], Awaitable[None]]


async def with_one_lost(lost: str, backup: str | None = None, dies_at_level_two: bool = False,
                        monkeypatch=None, after_level_two: bool = False,
                        at_level_two: dict[str, LevelTwoHook] | None = None) -> tuple[dict, float]:
    """Every member but ``lost`` averages; the backbone says ``lost`` left once the others
    are under way (or, ``dies_at_level_two``, once ``lost`` began level 2 and died there --
    or, ``after_level_two``, once it finished level 2 and died before its group got the
    slot), handing its slot to ``backup``; if the backup gives the round up, the backbone
    says the slot has nobody (Backups.gave_up). ``at_level_two``: per member, what else it
    does as its level 2 begins. Each member's outcome (or error), and how long the round
    took."""
    vectors = {p: torch.full((20_000,), float(i + 1)) for i, p in enumerate(NAMES)}
    meshes = make_meshes(NAMES)
    changes = {p: RoundChanges() for p in NAMES}
    loop = asyncio.get_running_loop()
    began = loop.time()
    lost_at_level_two = asyncio.Event()
    hooks = at_level_two or {}
    if dies_at_level_two or hooks:

        async def allreduce(plan, *args, **kwargs):
            if plan.offset >= LEVEL_ONE_PARTS and plan.me in hooks:
                await hooks[plan.me](plan, meshes[plan.me])
            if dies_at_level_two and plan.me == lost and plan.offset >= LEVEL_ONE_PARTS:
                if after_level_two:  # (its piece finished and sent to the others)
                    await butterfly_allreduce(plan, *args, **kwargs)
                lost_at_level_two.set()
                await asyncio.Event().wait()  # (dead)
            return await butterfly_allreduce(plan, *args, **kwargs)

        monkeypatch.setattr(grouped, "butterfly_allreduce", allreduce)

    async def member(me):
        plan = RoundPlan(3, 1, NAMES, [1.0] * 8, me, changes=changes[me], groups=BY_HAND)
        return await grouped_allreduce(plan, vectors[me] * 2, 2, 2.0, meshes[me], 60)

    try:
        rounds = {p: asyncio.ensure_future(member(p)) for p in NAMES if p != lost or dies_at_level_two}
        if dies_at_level_two:
            await asyncio.wait_for(lost_at_level_two.wait(), 30)
            rounds.pop(lost).cancel()
            await meshes[lost].close()
        else:
            await asyncio.wait(rounds.values(), timeout=1.0)  # (under way: links up, parts going)
        reducers = [backup if p == lost else p for p in NAMES] if backup else []
        for c in changes.values():
            c.update([lost], reducers)
        if backup:
            await asyncio.wait([rounds[backup]], timeout=30)
            if rounds[backup].done() and rounds[backup].exception() is not None:
                for c in changes.values():
                    c.update([lost], NAMES)
        await asyncio.wait(rounds.values(), timeout=30)
        took = loop.time() - began
        outcomes = {p: r.exception() or r.result() for p, r in rounds.items() if r.done()}
    finally:
        await asyncio.gather(*(m.close() for m in meshes.values()))
    return outcomes, took
