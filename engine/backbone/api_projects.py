"""The catalog, joining a project, the peers' control socket, the curve and the leaderboard."""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

from aiohttp import WSMsgType, web

from engine.backbone.accounts import token_digest
from engine.backbone.http import (
    authenticate_peer,
    backbone_of,
    client_group,
    json_reply,
    optional_user,
    project_of,
    read_json,
)
from engine.backbone.ice import ice_servers_for
from engine.backbone.sessions import PeerSession
from engine.backbone.store.account_records import User
from engine.backbone.tracker import Identity
from engine.project import ProjectSpec
from engine.wire import WIRE_VERSION, ProtocolError
from engine.wire.codec import Codec, encode_text
from engine.wire.control import MAX_CONTROL_MESSAGE, Ping, Pong, Signal, from_peer, version_mismatch
from engine.wire.rest import (
    Curve,
    JoinReply,
    JoinRequest,
    Leaderboard,
    LeaderboardEntry,
    ProjectList,
    Ranking,
)
from engine.wire.types import IcePolicy, PeerRole, total_count

log = logging.getLogger(__name__)
_join: Codec[JoinRequest] = Codec(JoinRequest, "join request", 64 * 1024)


async def list_projects(request: web.Request) -> web.Response:
    backbone = backbone_of(request)
    return json_reply(ProjectList([backbone.project_summary(p) for p in backbone.projects.values()]))


async def get_project(request: web.Request) -> web.Response:
    return json_reply(backbone_of(request).project_summary(project_of(request)))


def member_of(request: web.Request, spec: ProjectSpec) -> User | None:
    user = optional_user(request)
    if user is None and spec.require_account:
        raise web.HTTPUnauthorized(
            text=f"project {spec.id!r} does not accept anonymous peers: log in first (cotrain login)",
            headers={"WWW-Authenticate": "Bearer"})
    return user


def _too_many(wait: float, what: str) -> web.HTTPTooManyRequests:
    return web.HTTPTooManyRequests(text=f"{what}; try again in {wait:.0f} seconds",
                                   headers={"Retry-After": str(int(wait) + 1)})


async def join(request: web.Request) -> web.Response:
    spec = project_of(request)
    user = member_of(request, spec)
    body = await read_json(request, _join)
    if body.wire != WIRE_VERSION:
        raise web.HTTPBadRequest(text=version_mismatch(peer=body.wire, backbone=WIRE_VERSION))
    backbone = backbone_of(request)
    throttle, address = backbone.throttle, client_group(request)
    refused = throttle.refused.retry_after(address)
    if refused:
        raise _too_many(refused, "peers from your address flooded this backbone")
    if not throttle.joins.take(address):
        raise _too_many(throttle.joins.wait(address), "too many peers joined from your address")
    peer_id, token = secrets.token_hex(8), secrets.token_urlsafe(32)
    name = body.name or f"peer-{peer_id[:6]}"
    backbone.store.peers.add(peer_id, spec.id, name, token_digest(token), user.id if user else None,
                             body.role)
    kind = "auxiliary peer" if body.role is PeerRole.AUXILIARY else "peer"
    log.info("%s: %s %s (%s) joined%s", spec.id, kind, peer_id, name, f" for {user.username}" if user else "")
    return json_reply(
        JoinReply(
            peer_id=peer_id, token=token, project=spec, username=user.username if user else None,
            ice_servers=ice_servers_for(backbone.config.ice, peer_id),
            ice_policy=IcePolicy.RELAY if backbone.config.ice.relay_only else IcePolicy.ALL,
            report_interval=backbone.config.report_interval,
            max_checkpoint_bytes=backbone.config.max_checkpoint_bytes, wire_version=WIRE_VERSION,
        ),
        status=201,
    )


async def peer_socket(request: web.Request) -> web.StreamResponse:
    spec = project_of(request)
    backbone = backbone_of(request)
    peer_id = request.match_info["peer"]
    known = authenticate_peer(request, spec, peer_id)
    name, owner = known.name, known.user_id
    user = member_of(request, spec)
    if owner is not None and (user is None or user.id != owner):
        raise web.HTTPUnauthorized(text="this peer belongs to another account")
    if peer_id in backbone.sessions:
        raise web.HTTPConflict(text="this peer is already connected")
    if spec.id in backbone.folders and known.joined_at < backbone.store.models.since(spec.id):
        raise web.HTTPGone(text=f"project {spec.id!r} changed since this peer joined: join again")
    throttle, address = backbone.throttle, client_group(request)
    refused = max(throttle.refused.retry_after(peer_id), throttle.refused.retry_after(address))
    if refused:
        raise _too_many(refused, "this peer sent more than the backbone accepts")
    if _from_address(backbone, address) >= throttle.config.peers_per_address:
        raise _too_many(60, f"{throttle.config.peers_per_address} peers from your address are connected "
                            "already")
    ws = web.WebSocketResponse(heartbeat=20, max_msg_size=MAX_CONTROL_MESSAGE)
    await ws.prepare(request)
    # Other sockets may have been upgraded meanwhile: checked again, with no pause before
    # this one is counted.
    if peer_id in backbone.sessions:
        await ws.close(code=1008, message=b"this peer is already connected")
        return ws
    if _from_address(backbone, address) >= throttle.config.peers_per_address:
        await ws.close(code=1013, message=b"too many peers from your address are connected")
        return ws
    tracker = backbone.trackers[spec.id]
    session = PeerSession(peer_id, spec.id, name, owner, ws, address)
    backbone.sessions[peer_id] = session
    backbone.store.peers.connected(peer_id)
    backbone.send_ice_servers(session)  # the join reply's may have expired (a reconnect)
    backbone.execute(spec.id, tracker.join(peer_id, name, known.role, Identity(owner, address)))
    try:
        async for raw in ws:
            if raw.type == WSMsgType.TEXT:
                reason = _on_peer_message(backbone, session, raw.data)
                if reason:
                    log.warning("closing %s: %s", peer_id, reason)
                    await ws.close(code=1008, message=reason.encode()[:120])
                    break
            elif raw.type == WSMsgType.BINARY:
                await ws.close(code=1003, message=b"binary messages are not accepted")
                break
    finally:
        del backbone.sessions[peer_id]
        throttle.forget(peer_id)
        await session.close()
        backbone.store.peers.left(peer_id)
        backbone.execute(spec.id, tracker.leave(peer_id))
        log.info("%s: peer %s left", spec.id, peer_id)
    return ws


def _from_address(backbone, address: str) -> int:
    return sum(s.address == address for s in backbone.sessions.values())


def _on_peer_message(backbone, session: PeerSession, text: str) -> str | None:
    """Handle one control message; returns why the socket must close, or None."""
    try:
        msg = from_peer.decode(text)
    except ProtocolError as exc:
        return f"bad message: {exc}"
    throttle = backbone.throttle
    if not throttle.allow(session.peer_id, msg):
        if not throttle.should_disconnect(session.peer_id):
            return None  # dropped: it is slowed to what the limits allow
        pause = throttle.disconnected(session.peer_id, session.address)
        log.warning("%s: peer %s flooded the backbone; refused for %.0f s", session.project, session.peer_id,
                    pause)
        return f"rate limit exceeded; refused for {pause:.0f} s"
    if isinstance(msg, Ping):
        session.send(encode_text(Pong(msg.nonce)))
    elif isinstance(msg, Signal):
        target = backbone.sessions.get(msg.peer)
        if target is not None and target.project == session.project and msg.peer != session.peer_id:
            target.relay(encode_text(Signal(session.peer_id, msg.data)))
    else:
        tracker = backbone.trackers.get(session.project)
        if tracker is not None:  # (else it moved to another process: the socket is closing)
            backbone.execute(session.project, tracker.handle(session.peer_id, msg))
    return None


async def curve(request: web.Request) -> web.Response:
    spec = project_of(request)
    return json_reply(Curve(spec.id, backbone_of(request).store.curve.points(spec.id)))


@dataclass(frozen=True)
class QueryInt:
    """An integer query parameter: its bounds are checked here and published in the API."""

    name: str
    low: int
    high: int
    default: int
    description: str

    def read(self, request: web.Request) -> int:
        text = request.query.get(self.name)
        if text is None:
            return self.default
        if not (text.isascii() and text.isdigit() and len(text) <= 12) \
                or not self.low <= int(text) <= self.high:
            raise web.HTTPBadRequest(text=f"{self.name} must be an integer from {self.low} to {self.high}")
        return int(text)

    def schema(self) -> dict:
        return {"type": "integer", "minimum": self.low, "maximum": self.high, "default": self.default}


@dataclass(frozen=True)
class QueryRanking:
    """The leaderboard's ``by`` parameter: what it ranks by."""

    name: str
    description: str

    def read(self, request: web.Request) -> Ranking:
        text = request.query.get(self.name, Ranking.SAMPLES.value)
        try:
            return Ranking(text)
        except ValueError:
            choices = ", ".join(r.value for r in Ranking)
            raise web.HTTPBadRequest(text=f"{self.name} must be one of {choices}") from None

    def schema(self) -> dict:
        return {"type": "string", "enum": [r.value for r in Ranking], "default": Ranking.SAMPLES.value}


LIMIT = QueryInt("limit", 1, 500, 50, "entries per page")
OFFSET = QueryInt("offset", 0, 10**9, 0, "entries to skip")
BY = QueryRanking("by", "rank by samples computed, or by bytes aggregated (auxiliary peers)")


async def leaderboard(request: web.Request) -> web.Response:
    spec = project_of(request)
    backbone = backbone_of(request)
    limit, offset, by = LIMIT.read(request), OFFSET.read(request), BY.read(request)
    (samples_total, bytes_total), rows = backbone.store.credit.leaderboard(spec.id, limit, offset, by)
    online = backbone.online_users(spec.id)
    counted, total = (5, bytes_total) if by is Ranking.AGGREGATED else (2, samples_total)
    entries = [
        LeaderboardEntry(rank=offset + i + 1, username=row[0], samples=total_count([row[2]]),
                         share=min(round(row[counted] / total, 6), 1.0) if total > 0 else 0.0,
                         compute_seconds=round(max(row[3], 0.0), 1), last_seen=_iso(row[4]),
                         online=row[1] in online, aggregated_bytes=total_count([row[5]]),
                         withdrawn=total_count([row[6]]))
        for i, row in enumerate(rows)
    ]
    return json_reply(Leaderboard(project=spec.id, total_samples=total_count([samples_total]), limit=limit,
                                  offset=offset, entries=entries,
                                  total_aggregated_bytes=total_count([bytes_total]), by=by))


def _iso(timestamp: float) -> str | None:
    if not timestamp:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(timestamp))
