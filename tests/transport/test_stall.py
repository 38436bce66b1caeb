"""A receiver whose event loop stalls for 2 s, in its own process: the sender's sends wait on
the channel's buffer instead of piling up in memory, and every byte arrives."""

import asyncio
import contextlib
import hashlib
import json
import os
import sys

import msgspec
import psutil

from engine.aio import spawn
from engine.transport.ice import ice_configuration
from engine.transport.link import HIGH_WATER
from engine.transport.mailbox import Mailbox
from engine.transport.mesh import PeerMesh
from engine.wire.control import SignalData
from engine.wire.framing import MAX_CHUNK
from tests.transport.mesh_pair import blob, router

FRAMES, FRAME = 12, 4 * 1024 * 1024  # the mailbox keeps at most 16 frames nobody waits for yet


async def test_a_receiver_stalled_for_two_seconds_loses_nothing_and_the_sender_stays_bounded(
        stack, report_figure):
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.transport.stalled_receiver", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, env={**os.environ})
    assert child.stdin is not None and child.stdout is not None
    replies: asyncio.Queue = asyncio.Queue()

    def tell(message: dict) -> None:
        child.stdin.write((json.dumps(message) + "\n").encode())

    async def send_signal(target: str, data: SignalData) -> None:
        tell({"signal": msgspec.to_builtins(data)})

    mailbox = Mailbox()
    mesh = PeerMesh("a", send_signal, ice_configuration([]), mailbox, router(mailbox))

    async def listen() -> None:
        while line := await child.stdout.readline():
            message = json.loads(line)
            if "signal" in message:
                spawn(mesh.handle_signal("b", msgspec.convert(message["signal"], SignalData)))
            else:
                replies.put_nowait(message)

    listener = asyncio.ensure_future(listen())
    payloads = [os.urandom(FRAME) for _ in range(FRAMES)]
    peak = 0

    async def watch(link) -> None:
        nonlocal peak
        while True:
            peak = max(peak, link.connection.buffered_amount)
            await asyncio.sleep(0.005)

    try:
        link = await mesh.link("b", timeout=30)
        me = psutil.Process()
        rss = me.memory_info().rss
        watcher = asyncio.ensure_future(watch(link))
        tell({"stall": 2.0})
        assert await asyncio.wait_for(replies.get(), 10) == {"stalling": True}
        began = asyncio.get_running_loop().time()
        for i, payload in enumerate(payloads):
            await link.send(blob(i), payload)
        sent_in = asyncio.get_running_loop().time() - began
        grew = me.memory_info().rss - rss
        watcher.cancel()
        tell({"expect": FRAMES})
        reply = await asyncio.wait_for(replies.get(), 60)
        report_figure(f"{stack.value}: {FRAMES * FRAME >> 20} MiB sent to a receiver stalled for 2 s in "
                      f"{sent_in:.1f} s; sender's channel buffer peaked at {peak >> 10} KiB, its memory "
                      f"grew {grew >> 20} MiB")
        assert reply["sha256"] == hashlib.sha256(b"".join(payloads)).hexdigest()
        assert reply["stack"] == stack.value
        assert 0 < peak <= HIGH_WATER + MAX_CHUNK, peak
        # What the sender holds beyond its own payloads: the channel's buffer, not the 48 MB.
        assert grew < 24 * 1024 * 1024, (grew, sent_in)
    finally:
        listener.cancel()
        await mesh.close()
        child.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        await child.wait()
