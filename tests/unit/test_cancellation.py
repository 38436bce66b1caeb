"""A stopped peer stops: Python 3.11's ``asyncio.wait_for`` returns instead of raising
when what it waits for finishes in the same turn as the cancellation, and the loop around
it ran on -- the worker then waited for ever for its peer to leave, and never joined
under the login its user had just made (tests/app/test_flows.py on CI, 2026-12-07)."""

import asyncio
import contextlib

import pytest

from engine import aio
from engine.aio import cancel_and_wait, finished_within
from engine.tasks import create_task
from tests.collab.harness import TINY
from tests.unit.test_hold_at_target import TARGET, accumulate, peer

BOUND = 10.0  # seconds a stop may take here, however slow the machine


@pytest.fixture(scope="module")
def task():
    return create_task("demo-lm", dict(TINY), None)


async def test_a_peer_holding_at_the_target_stops_though_a_status_arrives_as_it_is_stopped(task):
    progress, _, counts = await peer(task)
    assert await accumulate(task, progress) == TARGET
    waiting = asyncio.ensure_future(progress.until_room())
    for _ in range(5):
        await asyncio.sleep(0)  # (into its wait for the round)
    assert not waiting.done(), "it holds what the step needs: it waits for the round"
    progress.observe(counts.status(progress.optimizer.epoch))  # the same turn as the stop
    waiting.cancel()
    done, _ = await asyncio.wait((waiting,), timeout=BOUND)
    assert waiting in done and waiting.cancelled()


async def test_a_task_that_swallowed_its_cancellation_is_cancelled_again(monkeypatch):
    monkeypatch.setattr(aio, "RECANCEL_AFTER", 0.05)
    news, woken = asyncio.Event(), []

    async def careless_loop() -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(news.wait(), 60)
            news.clear()
            woken.append(True)

    looping = asyncio.ensure_future(careless_loop())
    for _ in range(5):
        await asyncio.sleep(0)
    news.set()  # the same turn as the cancellation
    await asyncio.wait_for(cancel_and_wait([looping]), BOUND)
    assert looping.done() and looping.cancelled()


async def test_finished_within_says_whether_it_finished_and_leaves_nothing_waiting():
    event = asyncio.Event()
    assert not await finished_within(event.wait(), 0.01)
    asyncio.get_running_loop().call_soon(event.set)
    assert await finished_within(event.wait(), BOUND)
    leftovers = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.sleep(0)
    assert all(t.done() for t in leftovers), "a wait that timed out is cancelled, not left behind"
