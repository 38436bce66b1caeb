"""A backbone that restarts under many peers. Before: peers reconnected at once and without
pause, 16,000 attempts in 150 s. Now each waits a growing, jittered pause (0.5-1 s, then
1-2 s, ... up to a minute), so a backbone coming back is met by a trickle."""

import asyncio
import contextlib
import time

import pytest

from engine.peer.client import RECONNECT_FIRST, BackboneError, ControlClient
from tests.conftest import until
from tests.hostile.collaboration import Collaboration

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PEERS = 50
TRIES_WHILE_DOWN = 4  # how long the backbone stays away: until every peer tried this often


async def stay_connected(client: ControlClient, stopping: asyncio.Event) -> None:
    """What a peer's control loop does: read until the socket closes, then reconnect."""
    while not stopping.is_set():
        async for _ in client.messages():
            pass
        with contextlib.suppress(BackboneError):
            await client.reconnect(stopping, give_up_after=3600)


async def test_a_backbone_restart_under_fifty_peers_meets_a_trickle_of_reconnects(tmp_path, report_figure):
    collab = Collaboration(tmp_path, peers=0)
    stopping = asyncio.Event()
    clients = [ControlClient("", collab.project.id, f"peer-{i}", local_address=f"127.0.1.{i + 1}")
               for i in range(PEERS)]
    loops: list[asyncio.Task] = []
    try:
        collab.start_backbone()
        port = int(collab.url.rsplit(":", 1)[1])
        for client in clients:
            client.base_url = collab.url
            await client.join()
        loops = [asyncio.ensure_future(stay_connected(c, stopping)) for c in clients]
        assert collab.backbone is not None
        collab.backbone.popen.kill()  # a crash: no goodbye to anyone
        collab.backbone.popen.wait()
        down_at = time.monotonic()
        before = {id(c): c.connect_attempts for c in clients}

        def tries(client: ControlClient) -> int:
            return client.connect_attempts - before[id(client)]

        await until(lambda: all(tries(c) >= TRIES_WHILE_DOWN for c in clients), 120,
                    f"every peer to try {TRIES_WHILE_DOWN} times")
        down_for = time.monotonic() - down_at
        tried_while_down = sum(tries(c) for c in clients)
        collab.start_backbone(port)
        await collab.until(lambda: all(c.connected for c in clients), 120, "every peer back")
        back_after = time.monotonic() - down_at
        attempts = sum(tries(c) for c in clients)
        most = max(tries(c) for c in clients)
        report_figure(f"backbone away {down_for:.1f} s: {tried_while_down} attempts by {PEERS} peers "
                      f"({tried_while_down / down_for:.1f}/s); all back {back_after:.1f} s after the crash, "
                      f"{attempts} attempts in all, at most {most} by one peer")
        # The pauses double from RECONNECT_FIRST/2 at the least: n tries take at least
        # (2^n - 1) * RECONNECT_FIRST/2 seconds, whatever the jitter drew.
        assert down_for >= (2**TRIES_WHILE_DOWN - 1) * RECONNECT_FIRST / 2
        assert back_after < 60 and attempts <= PEERS * (TRIES_WHILE_DOWN + 3), attempts
    finally:
        stopping.set()
        for client in clients:
            await client.close()
        for loop in loops:
            with contextlib.suppress(asyncio.CancelledError, BackboneError):
                await asyncio.wait_for(loop, 10)
        collab.stop()
