"""TCP connections per address group, capped where they are accepted.

Below HTTP and the WebSocket layer: a host that opens connections without end (idle, or
sending a request a byte at a time) would otherwise fill the backbone's descriptor table
before any route sees it. Each accepted connection is counted against its address group
(``addresses.address_group``); one over the group's cap is closed at once, before aiohttp
builds anything for it. A trusted reverse proxy carries everyone's connections, so it is
not capped here (the routes limit what it forwards by the address it names).

aiohttp's own keep-alive timer does the rest (``HEADER_TIMEOUT``): it starts when a
connection opens and after each answer, and closes the connection if no complete request
head has arrived by then, however slowly the bytes of one trickle in.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from engine.backbone.addresses import address_group, plain_address

log = logging.getLogger(__name__)
HEADER_TIMEOUT = 10.0  # seconds for a request head after the connection or the last answer
BACKLOG = 1024  # connections the kernel queues for accept: a flood must not crowd others out


class ConnectionCap:
    """Open connections per address group (pure: no sockets here)."""

    def __init__(self, limit: int, ipv6_prefix: int, exempt: frozenset[str] = frozenset()) -> None:
        self.limit = limit
        self.ipv6_prefix = ipv6_prefix
        self.exempt = frozenset(plain_address(a) for a in exempt)
        self._open: dict[str, int] = {}
        self._refusing: set[str] = set()  # groups at their cap that were told so in the log

    def admit(self, address: str) -> str | None:
        """Count a new connection from ``address``: the key to release it with, or None if
        its group is at the cap (close it). An exempt proxy is counted, never capped."""
        plain = plain_address(address)
        exempt = plain in self.exempt
        group = plain if exempt else address_group(plain, self.ipv6_prefix)
        count = self._open.get(group, 0)
        if count >= self.limit and not exempt:
            if group not in self._refusing:
                self._refusing.add(group)
                log.warning("%s holds %d connections: closing its new ones", group, count)
            return None
        self._open[group] = count + 1
        return group

    def release(self, group: str) -> None:
        count = self._open.pop(group, 0) - 1
        if count > 0:
            self._open[group] = count
        if count < self.limit:
            self._refusing.discard(group)

    def open(self, group: str) -> int:
        return self._open.get(group, 0)


class _Gate(asyncio.Protocol):
    """One connection, admitted or closed; admitted, it is passed to the protocol the
    factory makes (aiohttp's), untouched but for the count kept around it."""

    def __init__(self, factory: Callable[[], asyncio.Protocol], cap: ConnectionCap) -> None:
        self._factory = factory
        self._cap = cap
        self._inner: asyncio.Protocol | None = None
        self._group = ""  # the key it is counted under, once admitted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        group = self._cap.admit(str(peer[0]) if isinstance(peer, tuple) else str(peer))
        if group is None:
            transport.close()  # nothing was read or written: closed at once
            return
        self._group = group
        self._inner = self._factory()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._cap.release(self._group)
            self._inner.connection_lost(exc)
            self._inner = None

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


async def listen(factory: Callable[[], asyncio.Protocol], host: str, port: int,
                 cap: ConnectionCap) -> asyncio.Server:
    """Serve ``factory``'s protocol (aiohttp's ``web.Server``) on host:port, each connection
    through the cap."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Gate(factory, cap), host, port, backlog=BACKLOG,
                                    reuse_address=True)
