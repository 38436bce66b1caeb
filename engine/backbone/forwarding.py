"""Requests for a project whose tracker runs in another backbone process (the holder of its
lease, engine/backbone/leases.py), passed on to it: a peer reaches any process -- through a
front door, or after the holder died and another took over -- and its control socket ends
at the one tracker. The client's address travels in X-Forwarded-For; the holder counts it
only if the forwarding process is among its ``--trusted-proxy`` addresses."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
from aiohttp import WSMsgType, web

from engine.backbone.http import json_error
from engine.wire.control import MAX_CONTROL_MESSAGE

log = logging.getLogger(__name__)
# Headers of one hop only (RFC 9110 section 7.6.1), and those aiohttp sets itself.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
                        "sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                        "sec-websocket-accept", "sec-websocket-protocol"})
UNSENDABLE = frozenset({1005, 1006, 1015})  # codes that only report, never travel (RFC 6455 7.4.1)
CONNECT_TIMEOUT = 5.0  # to reach the holder: past this the client hears 503 and tries again


def _headers(request: web.Request) -> dict[str, str]:
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
    chain = request.headers.get("X-Forwarded-For", "")
    remote = request.remote or "unknown"
    headers["X-Forwarded-For"] = f"{chain}, {remote}" if chain else remote
    return headers


def _unavailable(holder: str, exc: BaseException) -> web.HTTPServiceUnavailable:
    log.info("the project's holder %s did not answer: %r", holder, exc)
    return web.HTTPServiceUnavailable(text="the project's coordinator is not reachable just now; try again",
                                      headers={"Retry-After": "2"})


async def forward_request(request: web.Request, holder: str,
                          http: aiohttp.ClientSession) -> web.StreamResponse:
    """Pass an HTTP request on to ``holder`` and stream its answer back."""
    url = holder.rstrip("/") + request.rel_url.path_qs
    try:
        upstream = await http.request(request.method, url, headers=_headers(request), allow_redirects=False,
                                      data=request.content if request.body_exists else None,
                                      timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT))
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise _unavailable(holder, exc) from None
    async with upstream:
        # (its length kept: a checkpoint's download shows how far it got)
        kept = {k: v for k, v in upstream.headers.items()
                if k.lower() not in HOP_BY_HOP or k.lower() == "content-length"}
        reply = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=kept)
        await reply.prepare(request)
        async for chunk in upstream.content.iter_chunked(1 << 16):
            await reply.write(chunk)
        await reply.write_eof()
        return reply


async def forward_socket(request: web.Request, holder: str,
                         http: aiohttp.ClientSession) -> web.StreamResponse:
    """Open the same WebSocket at ``holder``, then relay text both ways until either end
    closes; the other end closes with the same code."""
    url = holder.rstrip("/") + request.rel_url.path_qs
    try:
        upstream = await asyncio.wait_for(http.ws_connect(url, headers=_headers(request), heartbeat=15,
                                                          max_msg_size=MAX_CONTROL_MESSAGE), CONNECT_TIMEOUT)
    except aiohttp.WSServerHandshakeError as exc:  # the holder refused it, with this status
        headers = {"Retry-After": "5"} if exc.status in (429, 503) else None
        why = f"the project's coordinator refused the control connection ({exc.status})"
        return json_error(exc.status, why, headers)
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise _unavailable(holder, exc) from None
    ws = web.WebSocketResponse(heartbeat=20, max_msg_size=MAX_CONTROL_MESSAGE)
    try:
        await ws.prepare(request)
        down = asyncio.ensure_future(_relay(upstream, ws))
        up = asyncio.ensure_future(_relay(ws, upstream))
        await asyncio.wait([down, up], return_when=asyncio.FIRST_COMPLETED)
        for task in (down, up):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await task
        code = upstream.close_code
        if code is None or code in UNSENDABLE or not 1000 <= code < 5000:
            code = 1012  # the holder went away: reconnect (to whichever process holds it next)
        await ws.close(code=code, message=b"the coordinator closed the socket")
    finally:
        await upstream.close()
    return ws


async def _relay(source: aiohttp.ClientWebSocketResponse[bool] | web.WebSocketResponse[bool],
                 sink: aiohttp.ClientWebSocketResponse[bool] | web.WebSocketResponse[bool]) -> None:
    async for message in source:
        if message.type == WSMsgType.TEXT:
            await sink.send_str(message.data)
        elif message.type in (WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED, WSMsgType.ERROR):
            break
