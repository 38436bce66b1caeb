"""asyncio helpers: the event loop to run on, and fire-and-forget tasks that are neither
garbage-collected mid-flight nor silent on failure."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)
_background: set[asyncio.Task] = set()


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop where it exists (Linux, macOS), else asyncio's own loop.

    aiortc's data channels are CPU-bound in Python; uvloop's faster UDP path averages a
    gradient about 1.5x sooner between two peers here (see tests/bench/allreduce.py).
    ``COTRAIN_EVENT_LOOP=asyncio`` opts out.
    """
    if os.environ.get("COTRAIN_EVENT_LOOP", "uvloop") == "uvloop":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)
