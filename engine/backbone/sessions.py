"""A connected peer's WebSocket, with its own bounded outbound queue.

Sending never blocks the backbone: each session drains its queue in its own task, and a
peer that cannot keep up with the backbone's messages is disconnected rather than slowing
the rest. What other peers send it (signals) is dropped instead once its queue is half
full: a flood aimed at a peer must never be what disconnects it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import web

from engine.aio import spawn

log = logging.getLogger(__name__)
MAX_QUEUED = 1000


class PeerSession:
    def __init__(self, peer_id: str, project: str, name: str, user_id: int | None,
                 ws: web.WebSocketResponse, address: str = "") -> None:
        self.peer_id = peer_id
        self.project = project
        self.name = name
        self.user_id = user_id
        self.ws = ws
        self.address = address  # its address group (addresses.py): what per-address limits count
        self.ice_renew_at = float("inf")  # when to send it fresh TURN credentials (UNIX time)
        self._queue: asyncio.Queue[str] = asyncio.Queue(MAX_QUEUED)
        self._writer = asyncio.ensure_future(self._drain())

    def send(self, text: str) -> None:
        try:
            self._queue.put_nowait(text)
        except asyncio.QueueFull:
            log.warning("peer %s is not reading its messages; disconnecting it", self.peer_id)
            spawn(self.ws.close(message=b"too slow to read messages"))

    def relay(self, text: str) -> bool:
        """Pass on another peer's message, unless this peer's queue is half full."""
        if self._queue.qsize() >= MAX_QUEUED // 2:
            return False
        self._queue.put_nowait(text)
        return True

    async def _drain(self) -> None:
        while True:
            text = await self._queue.get()
            try:
                await self.ws.send_str(text)
            except (ConnectionError, RuntimeError):
                return

    async def close(self) -> None:
        self._writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._writer
