"""What every route shares: JSON errors, bounded and validated bodies, who is asking."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from engine.backbone.accounts import token_digest
from engine.backbone.addresses import address_group, plain_address
from engine.backbone.store.account_records import User
from engine.backbone.store.database import Unavailable
from engine.backbone.store.peer_records import KnownPeer
from engine.project import ProjectSpec
from engine.wire import ProtocolError
from engine.wire.codec import Codec, encode
from engine.wire.rest import MAX_JSON_BODY, PEER_TOKEN_HEADER, ErrorReply

if TYPE_CHECKING:
    from engine.backbone.server import Backbone

log = logging.getLogger(__name__)
BACKBONE: web.AppKey[Backbone] = web.AppKey("backbone")
T = TypeVar("T")
BODY_TIMEOUT = 10.0  # seconds for a JSON body: one sent a byte at a time holds a connection no longer
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_reply(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """``body`` (one of engine.wire.rest's Structs) as the JSON answer."""
    return web.Response(body=encode(body), status=status, headers=headers, content_type="application/json")


def json_error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_reply(ErrorReply(message), status, headers)


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        text = exc.text or ""
        message = exc.reason if not text or text.startswith(f"{exc.status}:") else text
        headers = {k: v for k, v in exc.headers.items() if k in ("Retry-After", "WWW-Authenticate")}
        return json_error(exc.status, message, headers)
    except ProtocolError as exc:
        return json_error(400, str(exc))
    except Unavailable as exc:
        log.warning("%s %s: %s", request.method, request.path, exc)
        return json_error(503, "the backbone's database is not answering; try again shortly",
                          {"Retry-After": "10"})


def backbone_of(request: web.Request) -> Backbone:
    return request.app[BACKBONE]


def project_of(request: web.Request) -> ProjectSpec:
    name = request.match_info["project"]
    backbone = backbone_of(request)
    spec = backbone.projects.get(name)
    if spec is None and backbone.watch is not None and name in backbone.watch.refused:
        raise web.HTTPConflict(text=backbone.watch.refused[name])
    if spec is None:
        raise web.HTTPNotFound(text=f"no project {name!r} on this backbone")
    return spec


async def read_json(request: web.Request, codec: Codec[T]) -> T:
    """The body as ``codec`` reads it, or 413/400 with the reason."""
    too_big = web.HTTPRequestEntityTooLarge(
        max_size=MAX_JSON_BODY, actual_size=request.content_length or MAX_JSON_BODY + 1,
        text=f"request body larger than {MAX_JSON_BODY} bytes")
    if request.content_length is not None and request.content_length > MAX_JSON_BODY:
        raise too_big
    try:  # bounded by the application's client_max_size without a length, and in time
        raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(text=f"the request body must arrive within {BODY_TIMEOUT:.0f} s") \
            from None
    if len(raw) > MAX_JSON_BODY:
        raise too_big
    return codec.decode(raw)


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization")
    if header is None:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise web.HTTPUnauthorized(text="the Authorization header must be 'Bearer <token>'")
    return token.strip()


def optional_user(request: web.Request) -> User | None:
    """The user behind the bearer token; 401 if a token is given but not valid."""
    token = bearer_token(request)
    if token is None:
        return None
    user = backbone_of(request).store.accounts.user_for_token(token_digest(token))
    if user is None:
        raise web.HTTPUnauthorized(text="this token is not valid (expired, revoked or unknown): log in again",
                                   headers={"WWW-Authenticate": "Bearer"})
    return user


def required_user(request: web.Request) -> User:
    user = optional_user(request)
    if user is None:
        raise web.HTTPUnauthorized(text="log in first: this needs 'Authorization: Bearer <token>'",
                                   headers={"WWW-Authenticate": "Bearer"})
    return user


def client_address(request: web.Request) -> str:
    """Who is asking: the connection's address, or, when that is a proxy the owner trusts
    (``--trusted-proxy``), the last address in X-Forwarded-For that is not one -- a client
    can write anything there, only what the trusted proxies appended counts."""
    remote = plain_address(request.remote or "unknown")
    trusted = backbone_of(request).config.trusted_proxies
    if remote not in trusted:
        return remote
    hops = [hop.strip() for hop in request.headers.get("X-Forwarded-For", "").split(",") if hop.strip()]
    for hop in reversed(hops):
        try:
            address = plain_address(str(ipaddress.ip_address(hop)))
        except ValueError:
            return remote  # the proxy wrote something that is not an address: trust nothing
        if address not in trusted:
            return address
    return remote


def client_group(request: web.Request) -> str:
    """The address group of who is asking: what every per-address limit counts (an IPv6
    host picks among its /64's addresses at will)."""
    return address_group(client_address(request), backbone_of(request).config.ipv6_prefix)


def authenticate_peer(request: web.Request, spec: ProjectSpec, peer_id: str) -> KnownPeer:
    """A peer proves itself with the token it got at join."""
    token = request.headers.get(PEER_TOKEN_HEADER, "")
    known = backbone_of(request).store.peers.known(peer_id, spec.id)
    if not token or known is None or not hmac.compare_digest(known.token_sha256, token_digest(token)):
        raise web.HTTPUnauthorized(text="unknown peer or wrong peer token")
    return known
