"""Level 2 of a grouped round when a backup stands in for a lost slot reducer
(round_plan.stand_in): a piece the lost reducer had finished, and sent some of the others,
cannot be finished again -- the backup's group sum lacks the lost one's gradient, so its
bits would differ from those the others applied. Those others show the backup the result
they got; the backup then fails its round at once, and the backbone, hearing it, fails the
round on every member (backbone/tracker/backups.py ``gave_up``) rather than let them wait
for parts nobody sends again until the deadline."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from engine.aio import abandon
from engine.averaging.errors import AveragingError
from engine.averaging.lost_members import LostMembers
from engine.averaging.reducer_sends import Payload, ReducerSends
from engine.averaging.round_plan import RoundPlan
from engine.transport.mailbox import Key
from engine.transport.mesh import PeerMesh
from engine.wire.frames import Result


class FinishedParts:
    def __init__(self, plan: RoundPlan, mesh: PeerMesh, members: LostMembers, out: ReducerSends) -> None:
        self.plan, self.mesh, self.members, self.out = plan, mesh, members, out
        self._by: dict[int, tuple[str, Result, Payload]] = {}  # part: (reducer, result)
        if plan.stand_ins:
            plan.changes.watch(self._show_stand_ins)

    def received(self, j: int, reducer: str, result: Result, payload: Payload) -> None:
        if self.plan.stand_ins:
            self._by[j] = (reducer, result, payload)

    def _show_stand_ins(self) -> None:
        for j, (reducer, result, payload) in list(self._by.items()):
            now = self.members.reducers[j]
            if reducer in self.members.lost and now not in (reducer, self.plan.me):
                del self._by[j]
                self.out.to_peer(now, result, payload)

    async def unless_finished(self, j: int, gather: Coroutine[Any, Any, dict]) -> dict:
        """What ``gather`` gathers of part ``j`` -- unless a member shows us the result the
        reducer we stand in for had finished; then raise AveragingError."""
        plan = self.plan
        index = plan.wire(j)
        shown = [asyncio.ensure_future(self.mesh.mailbox.get(Key("result", plan.round_id, (index,), p), 1e9))
                 for p in plan.senders if p != plan.me]
        gathering = asyncio.ensure_future(gather)
        try:
            await asyncio.wait([gathering, *shown], return_when=asyncio.FIRST_COMPLETED)
            if not gathering.done():
                raise AveragingError(f"round {plan.round_id}: part {j}, which we took over, was finished by "
                                     "its reducer before it left; nobody can finish it again as the others "
                                     "applied it")
            return gathering.result()
        finally:
            abandon([gathering, *shown])
