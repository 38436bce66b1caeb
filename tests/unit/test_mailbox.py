"""Frames that wait for their round: each sender fills only its own quota."""

import asyncio

from engine.peer.state_sync import StateSync
from engine.transport.mailbox import Key, Mailbox
from engine.wire.frames import StateReply
from engine.wire.framing import Frame
from tests.transport.mesh_pair import blob


def frame(size: int = 10) -> Frame:
    return Frame(blob(1), b"x" * size)


async def test_a_flooding_sender_evicts_only_its_own_frames_and_is_named():
    box = Mailbox(max_items=4, max_bytes=1000)
    overflowed = []
    box.on_overflow = overflowed.append
    box.put(Key("part", 7, (0,), "honest"), frame())
    for i in range(1000):
        box.put(Key("part", 100 + i, (0,), "flooder"), frame())
    assert box.held("flooder") == (4, 40)
    assert set(overflowed) == {"flooder"}
    assert (await box.get(Key("part", 7, (0,), "honest"), timeout=0)).payload == b"x" * 10


async def test_a_sender_past_its_bytes_loses_its_oldest_frames():
    box = Mailbox(max_items=100, max_bytes=250)
    for i in range(5):
        box.put(Key("part", i, (0,), "big"), frame(100))
    assert box.held("big") == (2, 200)
    assert (await box.get(Key("part", 4, (0,), "big"), timeout=0)).payload == b"x" * 100
    assert box.held("big") == (1, 100)


async def test_a_waiter_gets_its_frame_without_it_counting_against_the_sender():
    box = Mailbox(max_items=1, max_bytes=100)
    asyncio.get_running_loop().call_soon(box.put, Key("result", 3, (0,), "a"), frame())  # once get() waits
    assert (await box.get(Key("result", 3, (0,), "a"), timeout=5)).payload == b"x" * 10
    assert box.held("a") == (0, 0)


async def test_state_replies_nobody_waits_for_are_not_kept():
    """A donor's answer that came after the joiner gave up on it (or that nobody asked for)
    takes no memory, and never counts as that donor flooding us."""
    box = Mailbox(max_items=1, max_bytes=100)
    overflowed = []
    box.on_overflow = overflowed.append
    sync = StateSync(client=None, mesh=None, mailbox=box, optimizer=None, progress=None,  # type: ignore[arg-type]
                     fresh_model=None, emit=lambda event: None)
    for request_id in range(1, 4):
        reply = StateReply(request_id=request_id, epoch=3, state_sha256="a" * 64)
        sync.on_frame("donor", Frame(reply, b"x" * 80), reply)
    assert box.held("donor") == (0, 0) and not overflowed


async def test_many_senders_each_within_its_quota_hold_at_most_the_total():
    box = Mailbox(max_items=4, max_bytes=400, max_total=1000)
    box.put(Key("part", 1, (0,), "honest"), frame(100))
    for i in range(50):
        box.put(Key("part", 2, (0,), f"sybil{i}"), frame(300))
    held = sum(box.held(s)[1] for s in ["honest", *(f"sybil{i}" for i in range(50))])
    assert held <= 1000
    assert (await box.get(Key("part", 1, (0,), "honest"), timeout=0)).payload == b"x" * 100
