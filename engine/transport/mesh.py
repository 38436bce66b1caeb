"""The links of one peer, set up on demand through the backbone's signaling relay.

Either side may need a link first (a round, a state download), so either side may offer.
When two offers cross ("glare"), the offer of the peer with the smaller id wins and the
other side answers it instead of waiting for its own.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiortc import RTCConfiguration, RTCDataChannel, RTCPeerConnection, RTCSessionDescription

from engine.transport import patches
from engine.transport.counters import LinkCounters
from engine.transport.link import LinkClosed, PeerLink
from engine.transport.mailbox import Mailbox
from engine.transport.shaping import RateLimiter
from engine.wire.control import SignalData
from engine.wire.framing import Frame, Incoming
from engine.wire.types import LinkPath, SignalKind

log = logging.getLogger(__name__)

SendSignal = Callable[[str, SignalData], Awaitable[None]]


@dataclass
class _Offer:
    conn: str
    pc: RTCPeerConnection
    answer: asyncio.Future[str]


class PeerMesh:
    def __init__(
        self,
        me: str,
        send_signal: SendSignal,
        config: RTCConfiguration,
        mailbox: Mailbox,
        on_frame: Callable[[str, Frame], None],
        on_incoming: Callable[[str, Incoming], None] | None = None,
        max_payload: int = 1 << 30,
        connect_timeout: float = 30.0,
        upload: RateLimiter | None = None,
    ) -> None:
        self.me = me
        self.config = config
        self.mailbox = mailbox
        self.connect_timeout = connect_timeout
        self._send_signal = send_signal
        self._on_frame = on_frame
        self._on_incoming = on_incoming
        self._max_payload = max_payload
        self._links: dict[str, PeerLink] = {}
        self._offers: dict[str, _Offer] = {}
        self._answering: set[str] = set()  # peers whose offer we are answering right now
        self._arrivals: dict[str, asyncio.Future[PeerLink]] = {}
        self._tasks: set[asyncio.Task] = set()
        self._retired = LinkCounters()
        self._closing = False
        self.upload = upload or RateLimiter()
        self.download_cap: float | None = None
        patches.apply()

    async def link(self, peer_id: str, timeout: float | None = None) -> PeerLink:
        """The open link to ``peer_id``, connecting first if there is none."""
        link = self._links.get(peer_id)
        if link is not None and link.is_open:
            return link
        arrival = self._arrival(peer_id)
        if peer_id not in self._offers and peer_id not in self._answering:
            # An answer under way brings the link too; a second offer now would make the
            # other side drop the link it is about to open, as if ours had died.
            self._spawn(self._offer(peer_id))
        try:
            return await asyncio.wait_for(asyncio.shield(arrival), timeout or self.connect_timeout)
        except asyncio.TimeoutError:
            raise LinkClosed(f"could not connect to {peer_id} in time", peer_id) from None

    def connected(self) -> list[str]:
        return [p for p, link in self._links.items() if link.is_open]

    def paths(self) -> dict[str, LinkPath | None]:
        return {p: link.path for p, link in self._links.items() if link.is_open}

    def counters(self) -> dict[str, LinkCounters]:
        return {p: link.counters for p, link in self._links.items()}

    def totals(self) -> LinkCounters:
        total = self._retired
        for counters in self.counters().values():
            total = total + counters
        return total

    def set_download_cap(self, bytes_per_second: float | None) -> None:
        """Share ``bytes_per_second`` among the open links; each peer is asked to keep to it."""
        self.download_cap = bytes_per_second
        self._spawn(self._advertise_limits())

    async def _advertise_limits(self) -> None:
        links = [link for link in self._links.values() if link.is_open]
        share = self.download_cap / len(links) if self.download_cap and links else None
        await asyncio.gather(*(link.ask_limit(share) for link in links))

    async def handle_signal(self, sender: str, signal: SignalData) -> None:
        """Act on an offer or answer relayed by the backbone; signals aiortc cannot use are
        logged and dropped."""
        try:
            if signal.kind is SignalKind.OFFER:
                await self._answer(sender, signal)
            else:
                offer = self._offers.get(sender)
                if offer is not None and offer.conn == signal.conn and not offer.answer.done():
                    offer.answer.set_result(signal.sdp)
        except Exception as exc:  # aiortc rejects a malformed SDP with assorted errors
            log.warning("could not use signal from %s: %s", sender, exc)

    async def drop(self, peer_id: str) -> None:
        link = self._links.get(peer_id)
        if link is not None:
            await link.close()

    async def close(self) -> None:
        self._closing = True
        for task in list(self._tasks):
            task.cancel()
        for offer in list(self._offers.values()):
            await offer.pc.close()
        await asyncio.gather(*(link.close_gracefully() for link in list(self._links.values())))

    def _arrival(self, peer_id: str) -> asyncio.Future[PeerLink]:
        arrival = self._arrivals.get(peer_id)
        if arrival is None or arrival.done():
            arrival = asyncio.get_running_loop().create_future()
            arrival.add_done_callback(_retrieve)
            self._arrivals[peer_id] = arrival
        return arrival

    def _spawn(self, coro: Awaitable) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _new_connection(self, peer_id: str) -> tuple[RTCPeerConnection, RTCDataChannel, PeerLink]:
        """A connection whose link listens from the start: the other side may send the
        moment its end of the channel opens, before ours reports open."""
        pc = RTCPeerConnection(self.config)
        channel = pc.createDataChannel("cotrain", ordered=True, negotiated=True, id=0)
        link = PeerLink(peer_id, pc, channel, self._on_frame, self._link_closed, self._on_incoming,
                        self._max_payload, self.upload)
        return pc, channel, link

    async def _offer(self, peer_id: str) -> None:
        pc, channel, link = self._new_connection(peer_id)
        offer = _Offer(uuid.uuid4().hex, pc, asyncio.get_running_loop().create_future())
        self._offers[peer_id] = offer
        try:
            await pc.setLocalDescription(await pc.createOffer())
            await self._send_signal(
                peer_id, SignalData(kind=SignalKind.OFFER, conn=offer.conn, sdp=pc.localDescription.sdp))
            sdp = await asyncio.wait_for(offer.answer, self.connect_timeout)
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="answer"))
            await self._until_open(pc, channel)
            self._adopt(link)
        except asyncio.CancelledError:
            await pc.close()
            raise
        except Exception as exc:
            await pc.close()
            log.info("connecting to %s failed: %s", peer_id, exc)
            arrival = self._arrivals.get(peer_id)
            if arrival is not None and not arrival.done() and self._offers.get(peer_id) is offer:
                arrival.set_exception(LinkClosed(f"could not connect to {peer_id}: {exc}", peer_id))
        finally:
            if self._offers.get(peer_id) is offer:
                del self._offers[peer_id]

    async def _answer(self, sender: str, signal: SignalData) -> None:
        mine = self._offers.get(sender)
        if mine is not None:
            if self.me < sender:
                return  # glare: our offer wins, the other side will answer it
            del self._offers[sender]
            if not mine.answer.done():
                mine.answer.cancel()
        old = self._links.get(sender)
        if old is not None:
            await old.close()  # the other side thinks this link is dead: start over
        pc, channel, link = self._new_connection(sender)
        self._answering.add(sender)
        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=signal.sdp, type="offer"))
            await pc.setLocalDescription(await pc.createAnswer())
            await self._send_signal(
                sender, SignalData(kind=SignalKind.ANSWER, conn=signal.conn, sdp=pc.localDescription.sdp))
            await self._until_open(pc, channel)
        except BaseException as exc:
            await pc.close()
            arrival = self._arrivals.get(sender)
            if arrival is not None and not arrival.done() and not isinstance(exc, asyncio.CancelledError):
                arrival.set_exception(LinkClosed(f"could not connect to {sender}: {exc}", sender))
            raise
        finally:
            self._answering.discard(sender)
        self._adopt(link)

    async def _until_open(self, pc: RTCPeerConnection, channel: RTCDataChannel) -> None:
        if channel.readyState == "open":
            return
        opened = asyncio.get_running_loop().create_future()

        def on_open() -> None:
            if not opened.done():
                opened.set_result(None)

        def on_state() -> None:
            if pc.connectionState in ("failed", "closed") and not opened.done():
                opened.set_exception(LinkClosed(f"connection {pc.connectionState}"))

        channel.on("open", on_open)
        pc.on("connectionstatechange", on_state)
        await asyncio.wait_for(opened, self.connect_timeout)

    def _adopt(self, link: PeerLink) -> None:
        if self._closing:
            self._spawn(link.close())
            return
        self._links[link.peer_id] = link
        self._spawn(link.announce_path())
        log.debug("link to %s open", link.peer_id)
        if self.download_cap:
            self._spawn(self._advertise_limits())
        arrival = self._arrival(link.peer_id)
        if not arrival.done():
            arrival.set_result(link)

    def _link_closed(self, link: PeerLink) -> None:
        if self._links.get(link.peer_id) is not link:
            return  # a connection attempt that lost a glare or never opened
        del self._links[link.peer_id]
        self._retired = self._retired + link.counters
        self.mailbox.fail_sender(link.peer_id, LinkClosed(f"link to {link.peer_id} closed", link.peer_id))
        if self.download_cap and not self._closing:
            self._spawn(self._advertise_limits())


def _retrieve(future: asyncio.Future) -> None:
    """Mark a failed arrival as seen: whoever waited for it has given up already."""
    if not future.cancelled():
        future.exception()
