"""A peer's background tasks: a bug in one stops the peer (never a peer half alive), a
request served for another peer may fail on its own, and stopping cancels them all."""

import asyncio

from engine.peer.background import PeerTasks


async def test_a_failed_task_stops_the_peer_and_a_tracked_one_does_not():
    failures: list[BaseException] = []
    tasks = PeerTasks(failures.append)

    async def broken() -> None:
        raise RuntimeError("a bug")

    tracked = asyncio.ensure_future(broken())
    tasks.track(tracked)
    spawned = tasks.spawn(broken())
    await asyncio.wait({tracked, spawned}, timeout=5)
    assert [str(e) for e in failures] == ["a bug"]


async def test_stopping_cancels_every_task_still_running():
    tasks = PeerTasks(lambda error: None)
    forever = [tasks.spawn(asyncio.Event().wait()) for _ in range(3)]
    tasks.cancel_all()
    done, _ = await asyncio.wait(forever, timeout=5)
    assert len(done) == 3 and all(t.cancelled() for t in done)
