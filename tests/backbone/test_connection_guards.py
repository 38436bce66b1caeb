"""The HTTP server's own defences, on a real backbone on loopback with small limits: a cap on
connections per address, a deadline for each request head (and for a JSON body), and idle
connections closed. The same at full scale, against `cotrain backbone`, is in
tests/hostile/test_http_floods.py."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from engine.backbone import http as http_module
from engine.backbone import server as server_module
from engine.backbone.rate_limits import LimitsConfig
from tests.collab.harness import running_backbone

DEADLINE = 0.5  # seconds for a request head, and for a body, in these tests


@pytest.fixture
async def backbone(tmp_path, monkeypatch):
    monkeypatch.setattr(server_module, "HEADER_TIMEOUT", DEADLINE)
    monkeypatch.setattr(http_module, "BODY_TIMEOUT", DEADLINE)
    async with running_backbone(tmp_path, limits=LimitsConfig(connections_per_address=4)) as bb:
        yield bb


async def connect(bb, address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = bb.url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port), local_addr=(address, 0))


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> float:
    """How long until the backbone closed the connection (fails after ``seconds``)."""
    began = time.monotonic()
    while await asyncio.wait_for(reader.read(65536), seconds):
        pass
    return time.monotonic() - began


async def health(bb, address: str) -> int:
    connector = aiohttp.TCPConnector(local_addr=(address, 0), force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http, http.get(f"{bb.url}/api/health") as resp:
        return resp.status


async def test_connections_over_the_cap_are_closed_at_once_and_others_still_served(backbone):
    held = [await connect(backbone, "127.0.3.1") for _ in range(4)]
    reader, _ = await connect(backbone, "127.0.3.1")
    assert await closed_within(reader, 1.0) < 0.2
    assert await health(backbone, "127.0.3.2") == 200
    held[0][1].close()
    await closed_within(held[0][0], 1.0)
    reader, writer = await connect(backbone, "127.0.3.1")  # its place is free again
    writer.write(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await asyncio.wait_for(reader.readline(), 1.0)).startswith(b"HTTP/1.1 200")
    for _, w in held:
        w.close()


async def test_a_head_sent_a_byte_at_a_time_is_cut_off_at_its_deadline(backbone):
    idle, _ = await connect(backbone, "127.0.3.3")
    trickle, writer = await connect(backbone, "127.0.3.3")

    async def dribble():
        for byte in b"POST /api/accounts HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 1000:
            writer.write(bytes([byte]))
            await asyncio.sleep(0.05)  # pacing: a byte every 50 ms, well inside any read timeout

    sending = asyncio.ensure_future(dribble())
    try:
        assert await closed_within(idle, 3 * DEADLINE) > 0.5 * DEADLINE
        assert await closed_within(trickle, 3 * DEADLINE) < 3 * DEADLINE
    finally:
        sending.cancel()


async def test_an_idle_keep_alive_connection_is_closed_and_a_slow_body_refused(backbone):
    reader, writer = await connect(backbone, "127.0.3.4")
    writer.write(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await asyncio.wait_for(reader.readline(), 1.0)).startswith(b"HTTP/1.1 200")
    assert await closed_within(reader, 3 * DEADLINE) < 3 * DEADLINE
    reader, writer = await connect(backbone, "127.0.3.4")
    writer.write(b"POST /api/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"user")
    status = await asyncio.wait_for(reader.readline(), 3 * DEADLINE)
    assert status.startswith(b"HTTP/1.1 408"), status
    writer.close()
