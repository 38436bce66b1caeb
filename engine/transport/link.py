"""One WebRTC connection to one other peer: a reliable ordered data channel carrying frames."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable

from aiortc import RTCDataChannel, RTCPeerConnection

from engine.aio import spawn
from engine.transport.counters import LinkCounters
from engine.transport.patches import nominated_path
from engine.transport.shaping import RateLimiter
from engine.wire import ProtocolError
from engine.wire.frames import Goodbye, GoodbyeAck, Header, PathView, ReceiveLimit
from engine.wire.framing import Frame, Incoming, Reassembler, encode
from engine.wire.types import LinkPath

log = logging.getLogger(__name__)

HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1024 * 1024
MIN_SEND_RATE = 1000.0  # bytes/s: a receive limit below this is taken as none


class LinkClosed(ConnectionError):
    """The link to a peer is gone; whatever was in flight on it is lost."""

    def __init__(self, message: str, peer: str | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class PeerLink:
    """Sends frames with backpressure on ``bufferedAmount``; hands complete frames to ``on_frame``.

    A peer that breaks the framing rules loses the link: we log why and close it, and
    everything waiting on that peer learns at once through ``on_closed``.
    """

    def __init__(
        self,
        peer_id: str,
        pc: RTCPeerConnection,
        channel: RTCDataChannel,
        on_frame: Callable[[str, Frame], None],
        on_closed: Callable[[PeerLink], None],
        on_incoming: Callable[[str, Incoming], None] | None = None,
        max_payload: int = 1 << 30,
        upload: RateLimiter | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.pc = pc
        self.channel = channel
        self.counters = LinkCounters()
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._on_incoming = on_incoming
        self._upload = upload or RateLimiter()
        self.remote_limit = RateLimiter()
        self._remote_path: LinkPath | None = None
        self.path_announced = asyncio.Event()  # the other side told us its view
        self._reassembler = Reassembler(max_payload)
        self._ids = itertools.count(1)
        self._drained = asyncio.Event()
        self._closed = asyncio.Event()
        self._acknowledged = asyncio.Event()
        channel.bufferedAmountLowThreshold = LOW_WATER
        channel.on("message", self._on_message)
        channel.on("bufferedamountlow", self._drained.set)
        channel.on("close", self._on_channel_close)
        pc.on("connectionstatechange", self._on_state)

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set() and self.channel.readyState == "open"

    async def send(self, header: Header, payload: bytes | bytearray | memoryview = b"") -> None:
        if not self.is_open:
            raise LinkClosed(f"link to {self.peer_id} is closed", self.peer_id)
        msg_id = next(self._ids) & 0xFFFFFFFF
        for chunk in encode(msg_id, header, payload):
            while self.channel.bufferedAmount > HIGH_WATER:
                self._drained.clear()
                drained = asyncio.ensure_future(self._drained.wait())
                closed = asyncio.ensure_future(self._closed.wait())
                await asyncio.wait({drained, closed}, return_when=asyncio.FIRST_COMPLETED)
                drained.cancel()
                closed.cancel()
                if not self.is_open:
                    raise LinkClosed(f"link to {self.peer_id} closed while sending", self.peer_id)
            await self._upload.acquire(len(chunk))
            await self.remote_limit.acquire(len(chunk))
            if not self.is_open:
                raise LinkClosed(f"link to {self.peer_id} closed while sending", self.peer_id)
            self.channel.send(chunk)
            self.counters.bytes_sent += len(chunk)
        self.counters.messages_sent += 1

    def _on_message(self, data: bytes | str) -> None:
        if self._closed.is_set():
            return
        try:
            frame, incoming = self._reassembler.feed(data)  # type: ignore[arg-type]
        except ProtocolError as exc:
            log.warning("dropping link to %s: %s", self.peer_id, exc)
            spawn(self.close())
            return
        self.counters.bytes_received += len(data)
        if frame is not None:
            self.counters.messages_received += 1
            header = frame.header
            if isinstance(header, Goodbye):
                spawn(self._acknowledge())
            elif isinstance(header, GoodbyeAck):
                self._acknowledged.set()
            elif isinstance(header, PathView):
                self._remote_path = header.view
                self.path_announced.set()
            elif isinstance(header, ReceiveLimit):
                rate = header.bytes_per_second
                self.remote_limit.set_rate(rate if rate is not None and rate >= MIN_SEND_RATE else None)
            else:
                self._on_frame(self.peer_id, frame)
        elif incoming is not None and self._on_incoming is not None:
            self._on_incoming(self.peer_id, incoming)

    def _on_state(self) -> None:
        if self.pc.connectionState in ("failed", "closed"):
            log.info("link to %s %s", self.peer_id, self.pc.connectionState)
            spawn(self.close())

    def _on_channel_close(self) -> None:
        spawn(self.close())

    async def _acknowledge(self) -> None:
        with contextlib.suppress(LinkClosed):
            await self.send(GoodbyeAck())

    def local_path(self) -> LinkPath | None:
        """The nominated candidate pair as this side sees it (None before ICE completes)."""
        return nominated_path(self.pc)

    @property
    def path(self) -> LinkPath | None:
        """host (direct), srflx (through a NAT mapping) or relay (through TURN), as the more
        indirect of both sides' views: a peer behind a NAT sees its own pair as host-host."""
        views = [v for v in (self.local_path(), self._remote_path) if v is not None]
        return max(views, key=lambda path: path.rank) if views else None

    async def announce_path(self) -> None:
        with contextlib.suppress(LinkClosed):
            await self.send(PathView(view=self.local_path()))

    async def ask_limit(self, bytes_per_second: float | None) -> None:
        """Ask the other side to send us at most this much (our download cap's share)."""
        with contextlib.suppress(LinkClosed):
            await self.send(ReceiveLimit(bytes_per_second=bytes_per_second))

    async def close_gracefully(self, timeout: float = 5.0) -> None:
        """Close once the peer confirms it has received everything we sent.

        ``send`` returns when data is queued, not delivered: closing at once could drop
        the last averaged part a peer still waits for. The channel is ordered, so the
        peer's acknowledgement of our goodbye means all earlier messages arrived.
        """
        try:
            await self.send(Goodbye())
            await asyncio.wait_for(self._acknowledged.wait(), timeout)
        except (LinkClosed, asyncio.TimeoutError):
            pass
        await self.close()

    async def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._on_closed(self)
        await self.pc.close()
