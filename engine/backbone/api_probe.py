"""Link probes: a peer measures its upload and download against the backbone when it joins,
as DeDLOC's volunteers ran a speed test, so the first round's shares already fit its link.

The peer times both directions itself; the backbone only sinks and sources bytes, at most
``PROBE_BYTES`` each, a few times a minute per peer (``LimitsConfig.probes_per_peer``), and
only for peers connected to the project (ids are cheap to make, live connections are
limited per address).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from engine.backbone.api_projects import QueryInt
from engine.backbone.http import authenticate_peer, backbone_of, json_error, json_reply, project_of
from engine.wire.rest import PEER_ID_HEADER, PROBE_BYTES, ProbeReply

PROBE_CHUNK = 1 << 16
PROBE_TIMEOUT = 30.0  # a trickled probe holds a connection no longer than this
SIZE = QueryInt("bytes", 1, PROBE_BYTES, 1 << 20, "bytes to send back")


def _admit(request: web.Request) -> web.Response | None:
    spec = project_of(request)
    peer_id = request.headers.get(PEER_ID_HEADER, "")
    authenticate_peer(request, spec, peer_id)
    backbone = backbone_of(request)
    if peer_id not in backbone.sessions:  # only peers taking part: ids are cheap, connections are not
        return json_error(409, "probe your link while connected to the project")
    throttle = backbone.throttle
    if not throttle.probes.take(peer_id):
        wait = throttle.probes.wait(peer_id)
        return json_error(429, f"too many link probes; try again in {wait:.0f} s",
                          {"Retry-After": str(int(wait) + 1)})
    return None


async def probe_upload(request: web.Request) -> web.Response:
    refused = _admit(request)
    if refused is not None:
        return refused
    try:
        received = await asyncio.wait_for(_sink(request), PROBE_TIMEOUT)
    except asyncio.TimeoutError:
        return json_error(408, f"a probe must arrive within {PROBE_TIMEOUT:.0f} s")
    return json_reply(ProbeReply(received))


async def _sink(request: web.Request) -> int:
    received = 0
    async for chunk in request.content.iter_chunked(PROBE_CHUNK):
        received += len(chunk)
        if received > PROBE_BYTES:
            raise web.HTTPRequestEntityTooLarge(max_size=PROBE_BYTES, actual_size=received,
                                                text=f"a probe carries at most {PROBE_BYTES} bytes")
    return received


async def probe_download(request: web.Request) -> web.StreamResponse:
    size = SIZE.read(request)  # before a probe is spent on a request that is refused anyway
    refused = _admit(request)
    if refused is not None:
        return refused
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = size
    await response.prepare(request)
    # Incompressible, so no proxy on the way can shrink it.
    block = bytes(range(256)) * (PROBE_CHUNK // 256)
    try:
        for start in range(0, size, PROBE_CHUNK):
            await response.write(block[: min(PROBE_CHUNK, size - start)])
        await response.write_eof()
    except ConnectionError:
        pass  # the peer had measured enough: it may stop reading whenever it likes
    return response
