"""asyncio helpers: the event loop to run on, fire-and-forget tasks that are neither
garbage-collected mid-flight nor silent on failure, waits that a cancellation always
ends, and abandoning the halves of a round that failed. (Python 3.11's
``asyncio.wait_for`` returns instead of raising when its awaitable finishes in the same
turn as the cancellation: a loop around it then runs on, and whoever awaits its end waits
for ever -- a worker once never left its peer to join under a new login.)"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)
_background: set[asyncio.Task] = set()

# A task still running this long after its cancellation swallowed it: it is cancelled again.
RECANCEL_AFTER = 1.0


def spawn(coro: Coroutine[Any, Any, Any]) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    _background.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task) -> None:
    _background.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("background task failed", exc_info=task.exception())


async def finished_within(awaitable: Awaitable[Any], timeout: float) -> bool:
    """Whether ``awaitable`` (an event's ``wait()``, say) finished within ``timeout``
    seconds; if not, it is cancelled. Unlike wait_for, a cancellation always raises."""
    waiter = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((waiter,), timeout=max(timeout, 0.0))
    finally:
        waiter.cancel()
    return bool(done)


async def cancel_and_wait(tasks: Iterable[asyncio.Task]) -> None:
    """Cancel ``tasks`` and return once all ended, cancelling again any that swallowed it
    (a wait_for deep inside that finished in the same turn)."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER)
        if pending:
            log.warning("%d task(s) ran on after their cancellation; cancelling again", len(pending))


def abandon(futures: Iterable[asyncio.Future]) -> None:
    """Cancel ``futures`` that are still running, and keep whatever they raise quiet: the
    abandoned halves of a failed round, whose error is the round's, already reported."""
    for future in futures:
        if not future.done():
            future.cancel()
        future.add_done_callback(_quiet)


def _quiet(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def all_or_none(coros: Iterable[Awaitable[T]]) -> list[T]:
    """Their results, in order; if one fails, the rest are abandoned and its error raised."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        abandon(tasks)
        raise


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
