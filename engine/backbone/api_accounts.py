"""Accounts, log-in sessions and a user's own totals."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from engine.backbone.accounts import (
    PASSWORD_HASH,
    Scrypt,
    hash_password,
    new_token,
    password_matches,
    token_digest,
)
from engine.backbone.http import (
    backbone_of,
    bearer_token,
    client_group,
    json_reply,
    read_json,
    required_user,
)
from engine.backbone.store.account_records import Secret, User, UsernameTaken
from engine.wire.codec import Codec
from engine.wire.rest import (
    LoginReply,
    LoginRequest,
    Me,
    ProjectTotals,
    Ranking,
    RegisterRequest,
    Revoked,
    SessionList,
)

log = logging.getLogger(__name__)
TIMELINE_DAYS = 7
# An unknown username costs the same hash as a known one: its answer's time names nothing.
_NOBODY = Secret(User(0, ""), b"\0" * 16, b"\0" * 32, PASSWORD_HASH.text)
_registration: Codec[RegisterRequest] = Codec(RegisterRequest, "registration", 64 * 1024)
_login: Codec[LoginRequest] = Codec(LoginRequest, "login", 64 * 1024)


async def register(request: web.Request) -> web.Response:
    body = await read_json(request, _registration)
    backbone = backbone_of(request)
    group = client_group(request)
    if not backbone.throttle.registrations.take(group):
        wait = backbone.throttle.registrations.wait(group)
        raise web.HTTPTooManyRequests(
            text=f"too many accounts made from your address; try again in {wait / 60:.0f} minutes",
            headers={"Retry-After": str(int(wait) + 1)})
    salt, digest = await backbone.password_work.run(group, hash_password, body.password)
    try:
        user = backbone.store.accounts.create_user(body.username, salt, digest, PASSWORD_HASH.text)
    except UsernameTaken:
        raise web.HTTPConflict(text=f"the username {body.username!r} is taken") from None
    token, stored = new_token()
    backbone.store.accounts.add_token(user, stored, _client(request))
    log.info("account %s created", user.username)
    return json_reply(LoginReply(user.username, token), status=201)


async def login(request: web.Request) -> web.Response:
    body = await read_json(request, _login)
    backbone = backbone_of(request)
    group, account = client_group(request), body.username.lower()
    # Counted before the slow hash (logins.py): every log-in per address group, failures per
    # account and group; successes per account.
    wait = backbone.logins.begin(account, group)
    if wait:
        raise _too_many_logins(wait)
    found = backbone.store.accounts.user_secret(body.username)
    secret = found or _NOBODY
    params = Scrypt.parse(secret.kdf)
    ok = await backbone.password_work.run(group, password_matches, body.password, secret.salt,
                                          secret.password_hash, params)
    if params != PASSWORD_HASH:
        # Hashed with older parameters: hashed anew now that the password is known -- and
        # anew when it is wrong, too, so that an old account answers no sooner than others.
        salt, digest = await backbone.password_work.run(group, hash_password, body.password)
        if ok and found is not None:
            backbone.store.accounts.set_password(found.user.id, salt, digest, PASSWORD_HASH.text)
            log.info("password of %s hashed anew with %s (was %s)", found.user.username,
                     PASSWORD_HASH.text, found.kdf)
    if not ok or found is None:
        raise web.HTTPUnauthorized(text="wrong username or password")
    wait = backbone.logins.succeeded(account, group)
    if wait:
        raise _too_many_logins(wait)
    token, stored = new_token()
    backbone.store.accounts.add_token(found.user, stored, _client(request))
    return json_reply(LoginReply(found.user.username, token))


def _too_many_logins(wait: float) -> web.HTTPTooManyRequests:
    return web.HTTPTooManyRequests(text=f"too many log-ins; try again in {wait:.0f} seconds",
                                   headers={"Retry-After": str(int(wait) + 1)})


async def logout(request: web.Request) -> web.Response:
    required_user(request)
    backbone_of(request).store.accounts.revoke_token(token_digest(bearer_token(request) or ""))
    return json_reply(Revoked(True))


async def list_sessions(request: web.Request) -> web.Response:
    """Where I am logged in: each token's client, when it was made and last used."""
    user = required_user(request)
    current = token_digest(bearer_token(request) or "")
    return json_reply(SessionList(backbone_of(request).store.accounts.tokens(user.id, current)))


async def revoke_session(request: web.Request) -> web.Response:
    """Log one of my sessions out (a lost laptop): its token stops working at once."""
    user = required_user(request)
    text = request.match_info["session"]
    if not text.isdigit() or not backbone_of(request).store.accounts.revoke_token_id(user.id, int(text)):
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
    for totals in backbone.store.credit.user_totals(user.id):
        totals.rank = backbone.store.credit.rank(totals.project, user.id)
        totals.aggregated_rank = backbone.store.credit.rank(totals.project, user.id, Ranking.AGGREGATED)
        totals.online = user.id in backbone.online_users(totals.project)
        projects.append(totals)
    since = time.time() - TIMELINE_DAYS * 86400
    return json_reply(Me(user.username, projects, backbone.store.credit.timeline(user.id, since)))
