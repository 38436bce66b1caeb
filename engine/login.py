"""Account calls to a backbone (register, log in, log out), shared by the CLI and the app."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeVar

import aiohttp

from engine.credentials import Login
from engine.problems import unreachable, where
from engine.wire import ProtocolError
from engine.wire.codec import Codec, encode
from engine.wire.rest import ErrorReply, LoginReply, LoginRequest, RegisterRequest, Revoked, reply_codec

log = logging.getLogger(__name__)
T = TypeVar("T")
_session: Codec[LoginReply] = reply_codec(LoginReply)
_revoked: Codec[Revoked] = reply_codec(Revoked)
_error: Codec[ErrorReply] = reply_codec(ErrorReply)


class AccountError(RuntimeError):
    """The backbone refused; the message is the backbone's reason."""


async def _call(method: str, url: str, reply: Codec[T], body: Any = None, token: str | None = None) -> T:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http, \
                http.request(method, url, data=encode(body) if body is not None else None,
                             headers=headers) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                try:
                    reason = _error.decode(raw).error
                except ProtocolError:
                    reason = f"the backbone answered {resp.status}"
                raise AccountError(reason)
            return reply.decode(raw)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        log.info("%s %s failed: %r", method, url, exc)
        raise AccountError(unreachable(url, exc)) from None
    except ProtocolError as exc:
        log.info("%s %s: %s", method, url, exc)
        raise AccountError(f"{where(url)} did not answer as a Cotrain backbone does.") from None


async def register(backbone: str, username: str, password: str) -> Login:
    body = await _call("POST", f"{backbone.rstrip('/')}/api/accounts", _session,
                       RegisterRequest(username, password))
    return Login(body.username, body.token)


async def log_in(backbone: str, username: str, password: str) -> Login:
    body = await _call("POST", f"{backbone.rstrip('/')}/api/sessions", _session,
                       LoginRequest(username, password))
    return Login(body.username, body.token)


async def log_out(backbone: str, token: str) -> None:
    await _call("DELETE", f"{backbone.rstrip('/')}/api/sessions", _revoked, token=token)
