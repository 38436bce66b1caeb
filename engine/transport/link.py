"""One link to one other peer: frames over a connection's reliable ordered data channel,
on whichever stack the pair negotiated (engine/transport/backends/)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable

from engine.aio import spawn
from engine.ratelimit import Buckets, Rate
from engine.transport.connection import ConnectionFailed, StackConnection
from engine.transport.counters import LinkCounters
from engine.transport.shaping import RateLimiter
from engine.wire import ProtocolError
from engine.wire.frames import Goodbye, GoodbyeAck, Header, PathView, ReceiveLimit
from engine.wire.framing import Frame, Incoming, Reassembler, encode
from engine.wire.types import LinkPath, Transport

log = logging.getLogger(__name__)

HIGH_WATER = 4 * 1024 * 1024
LOW_WATER = 1024 * 1024
# The least a peer may ask us to send it per second: lower requests are raised to it, so a
# peer that asks for a trickle cannot hold our sends (a state it asked for, say) for ever.
MIN_RECEIVE_LIMIT = 64 * 1024
# A message begun and then left unfinished this long costs its sender the link.
PARTIAL_IDLE = 60.0
# Frames a peer may send us: ten times an honest peer's most (a part, a result and a path
# view per round, ten rounds a second); more costs it the link.
FRAME_RATE = Rate(300.0, 1000.0)


class LinkClosed(ConnectionError):
    """The link to a peer is gone; whatever was in flight on it is lost."""

    def __init__(self, message: str, peer: str | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class PeerLink:
    """Sends frames with backpressure on the channel's buffer; hands complete frames to ``on_frame``.

    A peer that breaks the framing rules loses the link: we log why, note it in
    ``broke_rules`` and close it, and everything waiting on that peer learns at once
    through ``on_closed``.
    """

    def __init__(
        self,
        peer_id: str,
        connection: StackConnection,
        on_frame: Callable[[str, Frame], None],
        on_closed: Callable[[PeerLink], None],
        on_incoming: Callable[[str, Incoming], None] | None = None,
        max_payload: int = 1 << 30,
        upload: RateLimiter | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.connection = connection
        self.counters = LinkCounters()
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._on_incoming = on_incoming
        self._upload = upload or RateLimiter()
        self.remote_limit = RateLimiter()
        self._remote_path: LinkPath | None = None
        self.path_announced = asyncio.Event()  # the other side told us its view
        self._reassembler = Reassembler(max_payload)
        self._sending = 0  # messages under way out
        self.broke_rules: str | None = None  # why we dropped the link, if the peer's frames did it
        self._frames = Buckets(FRAME_RATE, time.monotonic)
        self._idle: asyncio.TimerHandle | None = None
        self.last_active = time.monotonic()  # when a frame last went either way
        self._ids = itertools.count(1)
        self._drained = asyncio.Event()
        self._closed = asyncio.Event()
        self._acknowledged = asyncio.Event()
        connection.set_low_water(LOW_WATER)
        connection.on_message = self._on_message
        connection.on_drained = self._drained.set
        connection.on_closed = self._on_connection_closed

    @property
    def transport(self) -> Transport:
        return self.connection.transport

    @property
    def is_open(self) -> bool:
        return not self._closed.is_set() and self.connection.is_open

    @property
    def busy(self) -> bool:
        """Whether a message is under way, either way (a state served may take minutes)."""
        return self._sending > 0 or self._reassembler.open > 0

    async def send(self, header: Header, payload: bytes | bytearray | memoryview = b"") -> None:
        if not self.is_open:
            raise LinkClosed(f"link to {self.peer_id} is closed", self.peer_id)
        self._sending += 1
        try:
            await self._send(header, payload)
        finally:
            self._sending -= 1

    async def _send(self, header: Header, payload: bytes | bytearray | memoryview) -> None:
        msg_id = next(self._ids) & 0xFFFFFFFF
        for chunk in encode(msg_id, header, payload):
            while self.connection.buffered_amount > HIGH_WATER:
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
            try:
                self.connection.send(chunk)
            except ConnectionFailed as exc:
                raise LinkClosed(f"link to {self.peer_id}: {exc}", self.peer_id) from exc
            self.counters.bytes_sent += len(chunk)
        self.counters.messages_sent += 1
        self.last_active = time.monotonic()

    def _on_message(self, data: bytes) -> None:
        if self._closed.is_set() or self.broke_rules:
            return
        try:
            frame, incoming = self._reassembler.feed(data)
            if frame is not None and not self._frames.take(""):
                raise ProtocolError(f"more than {FRAME_RATE.per_second:.0f} frames a second")
        except ProtocolError as exc:
            self.punish(str(exc))
            return
        self._watch_partials()
        self.last_active = time.monotonic()
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
                self.remote_limit.set_rate(None if rate is None else max(rate, MIN_RECEIVE_LIMIT))
            else:
                self._on_frame(self.peer_id, frame)
        elif incoming is not None and self._on_incoming is not None:
            self._on_incoming(self.peer_id, incoming)

    def punish(self, why: str) -> None:
        """Drop the link for what the peer sent (the mesh then keeps it away for a while)."""
        if self.broke_rules or self._closed.is_set():
            return
        log.warning("dropping link to %s: %s", self.peer_id, why)
        self.broke_rules = why
        spawn(self.close())

    def _watch_partials(self) -> None:
        """(Re)start the idle clock while a message is under way; stop it when none is."""
        if self._idle is not None:
            self._idle.cancel()
        self._idle = (asyncio.get_running_loop().call_later(PARTIAL_IDLE, self._stalled)
                      if self._reassembler.open else None)

    def _stalled(self) -> None:
        log.warning("dropping link to %s: a message under way sent nothing for %.0fs", self.peer_id,
                    PARTIAL_IDLE)
        spawn(self.close())

    def _on_connection_closed(self) -> None:
        if not self._closed.is_set():
            log.info("link to %s closed or failed", self.peer_id)
            spawn(self.close())

    async def _acknowledge(self) -> None:
        with contextlib.suppress(LinkClosed):
            await self.send(GoodbyeAck())

    @property
    def relayed_here(self) -> bool | None:
        """Whether this side reaches the other through its own TURN relay (None: not known yet)."""
        pair = self.connection.selected_pair()
        return None if pair is None else pair.relayed_here

    def local_path(self) -> LinkPath | None:
        """The selected candidate pair as this side sees it (None before ICE completes)."""
        pair = self.connection.selected_pair()
        return None if pair is None else pair.path

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
        if self._idle is not None:
            self._idle.cancel()
        self._on_closed(self)
        await self.connection.close()
