"""A peer's background tasks: all cancelled when it stops, and one that fails stops it (a
bug must not leave a peer half alive); tracked ones and chores may fail on their own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


class PeerTasks:
    def __init__(self, on_failure: Callable[[BaseException], None]) -> None:
        self._on_failure = on_failure
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
        """A task of the peer's: cancelled when it stops; if it fails, the peer stops."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def chore(self, coro: Coroutine[Any, Any, Any], what: str) -> asyncio.Task:
        """A job beside training (scoring the held-out set, uploading a checkpoint): cancelled
        when the peer stops; if it fails, it fails alone, its reason logged, and the peer trains on."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(lambda done: self._chore_done(done, what))
        return task

    def track(self, task: asyncio.Task) -> None:
        """A task that may fail on its own (a peer's request served): cancelled on stop."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error("peer task failed: %r", error, exc_info=error)
            self._on_failure(error)

    def _chore_done(self, task: asyncio.Task, what: str) -> None:
        self._tasks.discard(task)
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.warning("%s failed, training goes on: %s", what, describe(error), exc_info=error)


def describe(error: BaseException) -> str:
    """What went wrong, in words: an exception without a message is named by its type."""
    return str(error) or type(error).__name__
