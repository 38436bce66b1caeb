"""Keyed delivery of frames that may arrive before anyone waits for them."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable

from engine.wire.framing import Frame

Key = tuple[str, int, str]  # kind, id (a round's, a request's), sender


class Mailbox:
    """Frames keyed by (kind, id, sender).

    Early frames (a fast peer's part before our round starts) wait here, bounded in
    count and bytes: the oldest are dropped first, so a flooding peer cannot exhaust memory.
    """

    def __init__(self, max_items: int = 256, max_bytes: int = 1 << 30) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._items: OrderedDict[Key, Frame] = OrderedDict()
        self._bytes = 0
        self._waiters: dict[Key, asyncio.Future[Frame]] = {}

    def put(self, key: Key, frame: Frame) -> None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(frame)
            return
        self._remove(key)
        self._items[key] = frame
        self._bytes += len(frame.payload)
        while self._items and (len(self._items) > self.max_items or self._bytes > self.max_bytes):
            self._remove(next(iter(self._items)))

    async def get(self, key: Key, timeout: float) -> Frame:
        if key in self._items:
            frame = self._items.pop(key)
            self._bytes -= len(frame.payload)
            return frame
        waiter = asyncio.get_running_loop().create_future()
        self._waiters[key] = waiter
        try:
            return await asyncio.wait_for(waiter, max(timeout, 0.0))
        finally:
            if self._waiters.get(key) is waiter:
                del self._waiters[key]

    def fail_sender(self, sender: str, error: BaseException) -> None:
        """Wake everyone waiting on ``sender`` with ``error`` (its link is gone)."""
        for key, waiter in list(self._waiters.items()):
            if key[-1] == sender and not waiter.done():
                waiter.set_exception(error)

    def discard(self, keep: Callable[[Key], bool]) -> None:
        for key in [k for k in self._items if not keep(k)]:
            self._remove(key)

    def _remove(self, key: Key) -> None:
        frame = self._items.pop(key, None)
        if frame is not None:
            self._bytes -= len(frame.payload)
