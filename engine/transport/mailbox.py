"""Keyed delivery of frames that may arrive before anyone waits for them."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal, NamedTuple

from engine.wire.framing import Frame

Kind = Literal["part", "result", "shown", "input", "state"]


class Key(NamedTuple):
    """Where a frame waits for its reader."""

    kind: Kind
    id: int  # the round's, or the state request's
    slot: tuple[int, ...]  # in a round: the part's index (an input: and its position)
    sender: str


class Mailbox:
    """Frames keyed by what they are, their round or request, and their sender.

    Early frames (a fast peer's part before our round starts) wait here. Each sender has
    its own quota of frames and bytes: past it, that sender's oldest frames are dropped,
    never another's, so a flooding peer cannot exhaust memory or evict an honest message;
    and ``on_overflow`` hears of it (an honest peer is never that far ahead of us). Many
    senders together (Sybils, each within its quota) hold at most ``max_total`` bytes:
    past it, the sender holding the most loses its oldest frames.
    """

    def __init__(self, max_items: int = 16, max_bytes: int = 1 << 30, max_total: int = 4 << 30) -> None:
        self.max_items = max_items  # per sender
        self.max_bytes = max_bytes  # per sender
        self.max_total = max_total  # all senders
        self.on_overflow: Callable[[str], None] | None = None
        self._items: OrderedDict[Key, Frame] = OrderedDict()
        self._held: dict[str, tuple[int, int]] = {}  # sender -> (frames, bytes) waiting
        self._total = 0
        self._waiters: dict[Key, asyncio.Future[Frame]] = {}

    def put(self, key: Key, frame: Frame) -> None:
        waiter = self._waiters.pop(key, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(frame)
            return
        self._remove(key)
        self._items[key] = frame
        sender = key.sender
        count, size = self._held.get(sender, (0, 0))
        self._held[sender] = (count + 1, size + len(frame.payload))
        self._total += len(frame.payload)
        if self._over(sender) and self.on_overflow is not None:
            self.on_overflow(sender)
        while self._over(sender):
            self._remove(next(k for k in self._items if k.sender == sender))
        while self._total > self.max_total:
            biggest = max(self._held, key=lambda s: self._held[s][1])
            self._remove(next(k for k in self._items if k.sender == biggest))

    def held(self, sender: str) -> tuple[int, int]:
        """(frames, bytes) of ``sender``'s waiting here."""
        return self._held.get(sender, (0, 0))

    def _over(self, sender: str) -> bool:
        count, size = self._held.get(sender, (0, 0))
        return count > self.max_items or size > self.max_bytes

    async def get(self, key: Key, timeout: float) -> Frame:
        if key in self._items:
            frame = self._items[key]
            self._remove(key)
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
            if key.sender == sender and not waiter.done():
                waiter.set_exception(error)

    def discard(self, keep: Callable[[Key], bool]) -> None:
        for key in [k for k in self._items if not keep(k)]:
            self._remove(key)

    def _remove(self, key: Key) -> None:
        frame = self._items.pop(key, None)
        if frame is not None:
            self._total -= len(frame.payload)
            count, size = self._held[key.sender]
            if count == 1:
                del self._held[key.sender]
            else:
                self._held[key.sender] = (count - 1, size - len(frame.payload))
