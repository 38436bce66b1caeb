"""Frames that wait for their round: each sender fills only its own quota."""

import asyncio

from engine.transport.mailbox import Mailbox
from engine.wire.framing import Frame
from tests.transport.mesh_pair import blob


def frame(size: int = 10) -> Frame:
    return Frame(blob(1), b"x" * size)


async def test_a_flooding_sender_evicts_only_its_own_frames_and_is_named():
    box = Mailbox(max_items=4, max_bytes=1000)
    overflowed = []
    box.on_overflow = overflowed.append
    box.put(("part", 7, "honest"), frame())
    for i in range(1000):
        box.put(("part", 100 + i, "flooder"), frame())
    assert box.held("flooder") == (4, 40)
    assert set(overflowed) == {"flooder"}
    assert (await box.get(("part", 7, "honest"), timeout=0)).payload == b"x" * 10


async def test_a_sender_past_its_bytes_loses_its_oldest_frames():
    box = Mailbox(max_items=100, max_bytes=250)
    for i in range(5):
        box.put(("part", i, "big"), frame(100))
    assert box.held("big") == (2, 200)
    assert (await box.get(("part", 4, "big"), timeout=0)).payload == b"x" * 100
    assert box.held("big") == (1, 100)


async def test_a_waiter_gets_its_frame_without_it_counting_against_the_sender():
    box = Mailbox(max_items=1, max_bytes=100)
    asyncio.get_running_loop().call_soon(box.put, ("result", 3, "a"), frame())  # once get() waits
    assert (await box.get(("result", 3, "a"), timeout=5)).payload == b"x" * 10
    assert box.held("a") == (0, 0)
