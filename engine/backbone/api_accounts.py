"""Accounts, log-in sessions and a user's own totals."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from engine.backbone.accounts import hash_password, new_token, password_matches, token_digest
from engine.backbone.http import (
    backbone_of,
    bearer_token,
    client_address,
    json_reply,
    read_json,
    required_user,
)
from engine.backbone.store import UsernameTaken
from engine.wire.api import (
    LoginReply,
    LoginRequest,
    Me,
    ProjectTotals,
    Ranking,
    RegisterRequest,
    Revoked,
    SessionList,
)
from engine.wire.codec import Codec

log = logging.getLogger(__name__)
TIMELINE_DAYS = 7
_DUMMY_SALT, _DUMMY_HASH = b"\0" * 16, b"\0" * 32
_registration: Codec[RegisterRequest] = Codec(RegisterRequest, "registration", 64 * 1024)
_login: Codec[LoginRequest] = Codec(LoginRequest, "login", 64 * 1024)


async def register(request: web.Request) -> web.Response:
    body = await read_json(request, _registration)
    backbone = backbone_of(request)
    address = client_address(request)
    if not backbone.throttle.registrations.take(address):
        wait = backbone.throttle.registrations.wait(address)
        raise web.HTTPTooManyRequests(
            text=f"too many accounts made from your address; try again in {wait / 60:.0f} minutes",
            headers={"Retry-After": str(int(wait) + 1)})
    salt, digest = await asyncio.to_thread(hash_password, body.password)
    try:
        user = backbone.store.create_user(body.username, salt, digest)
    except UsernameTaken:
        raise web.HTTPConflict(text=f"the username {body.username!r} is taken") from None
    token, stored = new_token()
    backbone.store.add_token(user, stored, _client(request))
    log.info("account %s created", user.username)
    return json_reply(LoginReply(user.username, token), status=201)


async def login(request: web.Request) -> web.Response:
    body = await read_json(request, _login)
    backbone = backbone_of(request)
    address = client_address(request)
    # Failures count per account *and address*: an attacker elsewhere cannot lock the
    # owner out; and per address, across accounts. Both before the slow hash is checked
    # (then a success is taken back).
    key = f"{body.username.lower()}\0{address}"
    wait = max(backbone.logins_by_address.retry_after(address), backbone.logins_by_account.retry_after(key))
    if wait == 0:
        backbone.logins_by_address.attempt(address)
        backbone.logins_by_account.attempt(key)
    else:
        raise web.HTTPTooManyRequests(text=f"too many failed logins; try again in {wait:.0f} seconds",
                                      headers={"Retry-After": str(int(wait) + 1)})
    found = backbone.store.user_secret(body.username)
    salt, digest = (found[1], found[2]) if found else (_DUMMY_SALT, _DUMMY_HASH)
    ok = await asyncio.to_thread(password_matches, body.password, salt, digest)
    if not ok or found is None:
        raise web.HTTPUnauthorized(text="wrong username or password")
    backbone.logins_by_account.succeeded(key)
    backbone.logins_by_address.uncount(address)  # many users behind one NAT log in fine
    token, stored = new_token()
    backbone.store.add_token(found[0], stored, _client(request))
    return json_reply(LoginReply(found[0].username, token))


async def logout(request: web.Request) -> web.Response:
    required_user(request)
    backbone_of(request).store.revoke_token(token_digest(bearer_token(request) or ""))
    return json_reply(Revoked(True))


async def list_sessions(request: web.Request) -> web.Response:
    """Where I am logged in: each token's client, when it was made and last used."""
    user = required_user(request)
    current = token_digest(bearer_token(request) or "")
    return json_reply(SessionList(backbone_of(request).store.tokens(user.id, current)))


async def revoke_session(request: web.Request) -> web.Response:
    """Log one of my sessions out (a lost laptop): its token stops working at once."""
    user = required_user(request)
    text = request.match_info["session"]
    if not text.isdigit() or not backbone_of(request).store.revoke_token_id(user.id, int(text)):
        raise web.HTTPNotFound(text=f"you have no session {text}")
    return json_reply(Revoked(True))


def _client(request: web.Request) -> str:
    """What made the log-in, as its User-Agent says (shown in the list of sessions)."""
    agent = request.headers.get("User-Agent", "").strip()
    return "".join(c for c in agent if c.isprintable())[:100] or "unknown client"


async def me(request: web.Request) -> web.Response:
    user = required_user(request)
    backbone = backbone_of(request)
    projects: list[ProjectTotals] = []
    for totals in backbone.store.user_totals(user.id):
        totals.rank = backbone.store.rank(totals.project, user.id)
        totals.aggregated_rank = backbone.store.rank(totals.project, user.id, Ranking.AGGREGATED)
        totals.online = user.id in backbone.online_users(totals.project)
        projects.append(totals)
    since = time.time() - TIMELINE_DAYS * 86400
    return json_reply(Me(user.username, projects, backbone.store.timeline(user.id, since)))
