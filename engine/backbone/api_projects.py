"""The catalog, joining a project, the peers' control socket, the curve and the leaderboard."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from engine.backbone.accounts import token_digest
from engine.backbone.http import (
    authenticate_peer,
    backbone_of,
    optional_user,
    project_of,
    read_json,
)
from engine.backbone.ice import ice_servers_for
from engine.backbone.sessions import PeerSession
from engine.project import ProjectSpec
from engine.wire import ProtocolError
from engine.wire.messages import (
    CONTROL_TYPES,
    MAX_CONTROL_MESSAGE,
    Availability,
    Ping,
    Pong,
    Progress,
    Ready,
    RoundDone,
    Signal,
    SyncRequest,
    decode,
    encode,
)

log = logging.getLogger(__name__)
PEER_MESSAGES = (Progress, SyncRequest, Ready, RoundDone, Signal, Ping, Availability)
MAX_PAGE = 500


def project_json(spec: ProjectSpec) -> dict:
    return dataclasses.asdict(spec)


async def list_projects(request: web.Request) -> web.Response:
    backbone = backbone_of(request)
    return web.json_response(
        {"projects": [backbone.project_summary(p) for p in backbone.projects.values()]}
    )


async def get_project(request: web.Request) -> web.Response:
    return web.json_response(backbone_of(request).project_summary(project_of(request)))


@dataclass
class JoinRequest:
    name: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        if len(self.name) > 64 or not self.name.isprintable():
            raise ValueError("name must be at most 64 printable characters")


def _member(request: web.Request, spec: ProjectSpec):
    user = optional_user(request)
    if user is None and not spec.allow_anonymous:
        raise web.HTTPUnauthorized(
            text=f"project {spec.id!r} does not accept anonymous peers: log in first (cotrain login)",
            headers={"WWW-Authenticate": "Bearer"})
    return user


async def join(request: web.Request) -> web.Response:
    spec = project_of(request)
    user = _member(request, spec)
    body = await read_json(request, JoinRequest)
    backbone = backbone_of(request)
    peer_id, token = secrets.token_hex(8), secrets.token_urlsafe(32)
    name = body.name or f"peer-{peer_id[:6]}"
    backbone.store.add_peer(peer_id, spec.id, name, token_digest(token), user.id if user else None)
    log.info("%s: peer %s (%s) joined%s", spec.id, peer_id, name, f" for {user.username}" if user else "")
    return web.json_response(
        {
            "peer_id": peer_id,
            "token": token,
            "username": user.username if user else None,
            "project": project_json(spec),
            "ice_servers": ice_servers_for(backbone.config.ice, peer_id),
            "ice_policy": "relay" if backbone.config.ice.relay_only else "all",
            "report_interval": backbone.config.report_interval,
            "max_checkpoint_bytes": backbone.config.max_checkpoint_bytes,
        },
        status=201,
    )


async def peer_socket(request: web.Request) -> web.StreamResponse:
    spec = project_of(request)
    backbone = backbone_of(request)
    peer_id = request.match_info["peer"]
    name, owner = authenticate_peer(request, spec, peer_id)
    user = _member(request, spec)
    if owner is not None and (user is None or user.id != owner):
        raise web.HTTPUnauthorized(text="this peer belongs to another account")
    if peer_id in backbone.sessions:
        raise web.HTTPConflict(text="this peer is already connected")
    ws = web.WebSocketResponse(heartbeat=20, max_msg_size=MAX_CONTROL_MESSAGE)
    await ws.prepare(request)
    tracker = backbone.trackers[spec.id]
    session = PeerSession(peer_id, spec.id, name, owner, ws)
    backbone.sessions[peer_id] = session
    backbone.store.peer_connected(peer_id)
    backbone.send_ice_servers(session)  # the join reply's may have expired (a reconnect)
    backbone.execute(spec.id, tracker.join(peer_id, name))
    try:
        async for raw in ws:
            if raw.type == WSMsgType.TEXT:
                reason = _on_peer_message(backbone, session, raw.data)
                if reason:
                    log.info("closing %s: %s", peer_id, reason)
                    await ws.close(code=1008, message=reason.encode()[:120])
                    break
            elif raw.type == WSMsgType.BINARY:
                await ws.close(code=1003, message=b"binary messages are not accepted")
                break
    finally:
        backbone.sessions.pop(peer_id, None)
        await session.close()
        backbone.store.peer_left(peer_id)
        backbone.execute(spec.id, tracker.leave(peer_id))
        log.info("%s: peer %s left", spec.id, peer_id)
    return ws


def _on_peer_message(backbone, session: PeerSession, text: str) -> str | None:
    """Handle one control message; returns why the socket must close, or None."""
    try:
        msg = decode(text, CONTROL_TYPES)
    except ProtocolError as exc:
        return f"bad message: {exc}"
    if not isinstance(msg, PEER_MESSAGES):
        return f"peers may not send {msg.TYPE!r}"
    if isinstance(msg, Ping):
        session.send(encode(Pong(msg.nonce)))
    elif isinstance(msg, Signal):
        target = backbone.sessions.get(msg.peer)
        if target is not None and target.project == session.project and msg.peer != session.peer_id:
            target.send(encode(Signal(session.peer_id, msg.data)))
    else:
        backbone.execute(session.project, backbone.trackers[session.project].handle(session.peer_id, msg))
    return None


async def curve(request: web.Request) -> web.Response:
    spec = project_of(request)
    return web.json_response({"project": spec.id, "epochs": backbone_of(request).store.curve(spec.id)})


def _query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit() or not low <= int(text) <= high:
        raise web.HTTPBadRequest(text=f"{name} must be an integer from {low} to {high}")
    return int(text)


async def leaderboard(request: web.Request) -> web.Response:
    spec = project_of(request)
    backbone = backbone_of(request)
    limit = _query_int(request, "limit", 50, 1, MAX_PAGE)
    offset = _query_int(request, "offset", 0, 0, 10**9)
    total, rows = backbone.store.leaderboard(spec.id, limit, offset)
    online = backbone.online_users(spec.id)
    entries = [
        {"rank": offset + i + 1, "username": username, "samples": samples,
         "share": round(samples / total, 6) if total else 0.0,
         "compute_seconds": round(seconds, 1), "last_seen": _iso(last_seen),
         "online": user_id in online}
        for i, (username, user_id, samples, seconds, last_seen) in enumerate(rows)
    ]
    return web.json_response({"project": spec.id, "total_samples": total, "limit": limit,
                              "offset": offset, "entries": entries})


def _iso(timestamp: float) -> str | None:
    if not timestamp:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
