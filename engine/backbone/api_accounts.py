"""Accounts, log-in sessions and a user's own totals."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web

from engine.backbone.accounts import hash_password, new_token, password_matches, token_digest
from engine.backbone.http import backbone_of, bearer_token, json_reply, read_json, required_user
from engine.backbone.store import UsernameTaken
from engine.wire.api import LoginReply, LoginRequest, Me, ProjectTotals, RegisterRequest, Revoked
from engine.wire.codec import Codec

log = logging.getLogger(__name__)
TIMELINE_DAYS = 7
_DUMMY_SALT, _DUMMY_HASH = b"\0" * 16, b"\0" * 32
_registration: Codec[RegisterRequest] = Codec(RegisterRequest, "registration", 64 * 1024)
_login: Codec[LoginRequest] = Codec(LoginRequest, "login", 64 * 1024)


async def register(request: web.Request) -> web.Response:
    body = await read_json(request, _registration)
    backbone = backbone_of(request)
    salt, digest = await asyncio.to_thread(hash_password, body.password)
    try:
        user = backbone.store.create_user(body.username, salt, digest)
    except UsernameTaken:
        raise web.HTTPConflict(text=f"the username {body.username!r} is taken") from None
    token, stored = new_token()
    backbone.store.add_token(user, stored)
    log.info("account %s created", user.username)
    return json_reply(LoginReply(user.username, token), status=201)


async def login(request: web.Request) -> web.Response:
    body = await read_json(request, _login)
    backbone = backbone_of(request)
    account, address = body.username.lower(), request.remote or "unknown"
    wait = max(backbone.login_failures_by_account.retry_after(account),
               backbone.login_failures_by_address.retry_after(address))
    if wait > 0:
        raise web.HTTPTooManyRequests(text=f"too many failed logins; try again in {wait:.0f} seconds",
                                      headers={"Retry-After": str(int(wait) + 1)})
    found = backbone.store.user_secret(body.username)
    salt, digest = (found[1], found[2]) if found else (_DUMMY_SALT, _DUMMY_HASH)
    ok = await asyncio.to_thread(password_matches, body.password, salt, digest)
    if not ok or found is None:
        backbone.login_failures_by_account.failed(account)
        backbone.login_failures_by_address.failed(address)
        raise web.HTTPUnauthorized(text="wrong username or password")
    backbone.login_failures_by_account.succeeded(account)
    token, stored = new_token()
    backbone.store.add_token(found[0], stored)
    return json_reply(LoginReply(found[0].username, token))


async def logout(request: web.Request) -> web.Response:
    required_user(request)
    backbone_of(request).store.revoke_token(token_digest(bearer_token(request) or ""))
    return json_reply(Revoked(True))


async def me(request: web.Request) -> web.Response:
    user = required_user(request)
    backbone = backbone_of(request)
    projects: list[ProjectTotals] = []
    for totals in backbone.store.user_totals(user.id):
        totals.rank = backbone.store.rank(totals.project, user.id)
        totals.online = user.id in backbone.online_users(totals.project)
        projects.append(totals)
    since = time.time() - TIMELINE_DAYS * 86400
    return json_reply(Me(user.username, projects, backbone.store.timeline(user.id, since)))
