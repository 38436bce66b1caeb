"""What a reducer sends every sender of a round: the hash of its own part before it takes
theirs (a checked project's Shown) and each result. Results go one at a time to each peer,
in piece order: with the peer's own parts on the same link, that keeps what is under way
within its Reassembler's limit. A backup that stands in for a lost sender later (a grouped
round's level 2, round_plan.stand_in) gets what the others got before it came."""

from __future__ import annotations

import asyncio
import logging

from engine.averaging.lost_members import LostMembers
from engine.averaging.round_plan import RoundPlan
from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mesh import PeerMesh
from engine.wire import ProtocolError
from engine.wire.frames import Result, Shown

log = logging.getLogger(__name__)

Payload = bytes | bytearray | memoryview
Frame = tuple[Result | Shown, Payload]


class ReducerSends:
    def __init__(self, plan: RoundPlan, mesh: PeerMesh, links: dict[str, PeerLink], members: LostMembers,
                 timeout: float) -> None:
        self.plan, self.mesh, self.links, self.members, self.timeout = plan, mesh, links, members, timeout
        self.began = asyncio.get_running_loop().time()
        self.sends: list[asyncio.Future] = []
        self._last: dict[str, asyncio.Future] = {}  # per peer, the latest result under way
        self._out: list[tuple[Frame, set[str]]] = []  # each frame, and whom it went to
        self.closed = False  # our round is over: a stand-in that comes now finds the part finished
        plan.changes.watch(self._to_stand_ins)

    def to_senders(self, header: Result | Shown, payload: Payload) -> None:
        """``header`` and ``payload`` to every sender of the round still in it."""
        sent: set[str] = set()
        self._out.append(((header, payload), sent))
        self._deliver((header, payload), sent)

    async def finish(self, grace: float) -> None:
        """Until our frames are out, or as long again as the round took (they go on after);
        then our round is over for stand-ins."""
        if self.sends:
            now = asyncio.get_running_loop().time()
            await asyncio.wait(self.sends, timeout=max(grace, now - self.began))
        self.closed = True

    def to_peer(self, peer: str, header: Result | Shown, payload: Payload) -> None:
        """One frame for one peer, within the round's time."""
        self.sends.append(self.mesh.spawn(self._send_to(peer, header, payload)))

    def _to_stand_ins(self) -> None:
        if self.closed:
            return  # (we hold every result: the stand-in is shown the one its reducer finished)
        for frame, sent in self._out:
            self._deliver(frame, sent)

    def _deliver(self, frame: Frame, sent: set[str]) -> None:
        header, payload = frame
        for peer in self.plan.senders:
            if peer == self.plan.me or peer in self.members.lost or peer in sent:
                continue
            sent.add(peer)
            if isinstance(header, Shown):  # (not behind results: a sender waits on it to send)
                self.to_peer(peer, header, payload)
                continue
            send = self.mesh.spawn(self._send_after(peer, header, payload, self._last.get(peer)))
            self._last[peer] = send
            self.sends.append(send)

    async def _send_after(self, peer: str, header: Result, payload: Payload,
                          after: asyncio.Future | None) -> None:
        if after is not None:
            await asyncio.wait({after})
        await self._send_to(peer, header, payload)

    async def _send_to(self, peer: str, header: Result | Shown, payload: Payload) -> None:
        """A frame for ``peer`` within the round's time (an optional member's link may still
        be opening: it dials us, we never dial it, so twenty silent newcomers cost a reducer
        no connections, and a newcomer whose part came too late still gets its results);
        one that cannot go is logged, and costs the round nothing here."""
        remaining = self.timeout - (asyncio.get_running_loop().time() - self.began)
        try:
            link = self.links.get(peer)
            if link is None:
                dial = peer not in self.plan.optional
                link = await asyncio.wait_for(self.mesh.link(peer, dial=dial), max(remaining, 0.0))
            await asyncio.wait_for(link.send(header, payload), max(remaining, 1.0))
        except (asyncio.TimeoutError, LinkClosed, ProtocolError) as exc:
            log.info("round %d: no %s for %s (%s)", self.plan.round_id, header.__struct_config__.tag, peer,
                     exc or "timeout")
