"""The backbone's word on a round's members as the round goes (RoundChanges: who left
midway, who reduces each part now), and waiting on members with it: a member that left is
waited for no longer, and its failures are not ours."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from engine.aio import finished_within
from engine.averaging.round_plan import RoundPlan

# A link to a member that died may close before the backbone says the member left: wait
# this long for its word (a Reassign) before the round fails. A killed peer's control
# socket closes with its process, and the word arrives in a tenth of a second; a link that
# dies under a peer still connected to the backbone (its NAT rebound) must fail the round
# well before its deadline, naming that peer, so the tracker keeps the pair apart.
VERDICT_WAIT = 2.0


class LostMembers:
    """One round's view of its members lost midway, and of the links that closed under it."""

    def __init__(self, plan: RoundPlan) -> None:
        self.plan = plan
        self.closed: set[str] = set()  # whose link closed under the round

    @property
    def reducers(self) -> list[str]:
        """Who reduces part j: its member, or the backup the backbone named once it was lost."""
        plan = self.plan
        given = plan.changes.reducers
        if given is not None and len(given) == plan.parts and set(given) <= set(plan.group):
            return given
        return [plan.owner(j) for j in range(plan.parts)]

    @property
    def lost(self) -> frozenset[str]:
        """The members the backbone says left midway (RoundChanges): of the round, not only of
        this level of a grouped one (a backup may stand in for a lost member here)."""
        return self.plan.changes.lost - {self.plan.me}

    async def until_done(self, waits: Mapping[str, asyncio.Future], needed: Iterable[str]) -> None:
        """Until the waits of the ``needed`` peers are done -- or those peers are lost: a
        member that left midway is waited for no longer, and its failures are not ours."""
        needed = list(needed)
        while True:
            for p in needed:
                w = waits[p]
                failed = p not in self.lost and w.done() and not w.cancelled() and w.exception() is not None
                if failed and not await self.lost_soon(p):
                    raise w.exception()  # type: ignore[misc]
            pending = [waits[p] for p in needed if p not in self.lost and not waits[p].done()]
            if not pending:
                return
            await self.any_or_news(pending)

    async def any_or_news(self, futures: list[asyncio.Future]) -> None:
        """Until one of ``futures`` is done, or the backbone's word on lost members changes."""
        news = asyncio.ensure_future(self.plan.changes.wait())
        try:
            await asyncio.wait([*futures, news], return_when=asyncio.FIRST_COMPLETED)
        finally:
            news.cancel()

    async def lost_soon(self, peer: str) -> bool:
        """Whether the backbone says ``peer`` left, within VERDICT_WAIT (its link failed;
        if the round's deadline comes first, the peer is still named as the suspect)."""
        self.closed.add(peer)
        loop = asyncio.get_running_loop()
        until = loop.time() + VERDICT_WAIT
        while peer not in self.lost and loop.time() < until:
            await finished_within(self.plan.changes.wait(), until - loop.time())
        return peer in self.lost
