"""HTTP and WebSocket routes of the backbone. Every input is validated; errors are JSON
``{"error": "..."}`` with a 4xx status, and nothing a client sends can take the server down."""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import logging
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web

from engine import __version__
from engine.backbone.checkpoints import CheckpointRejected
from engine.backbone.sessions import PeerSession
from engine.peer.client import PEER_ID_HEADER, PEER_TOKEN_HEADER
from engine.project import ProjectSpec
from engine.wire import WIRE_VERSION, ProtocolError
from engine.wire.messages import (
    CONTROL_TYPES,
    MAX_CONTROL_MESSAGE,
    CheckpointInfo,
    Progress,
    Ready,
    RoundDone,
    Signal,
    SyncRequest,
    decode,
    encode,
)
from engine.wire.schema import from_dict

if TYPE_CHECKING:
    from engine.backbone.server import Backbone

log = logging.getLogger(__name__)
MAX_JSON_BODY = 64 * 1024
PEER_MESSAGES = (Progress, SyncRequest, Ready, RoundDone, Signal)
SHA256 = re.compile(r"^[0-9a-f]{64}$")


def json_error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def errors_as_json(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return json_error(exc.status, exc.reason if exc.text is None or exc.text.startswith(
            f"{exc.status}:") else exc.text)
    except ProtocolError as exc:
        return json_error(400, str(exc))


def _backbone(request: web.Request) -> Backbone:
    from engine.backbone.server import BACKBONE_KEY

    return request.app[BACKBONE_KEY]


def _project(request: web.Request) -> ProjectSpec:
    spec = _backbone(request).projects.get(request.match_info["project"])
    if spec is None:
        raise web.HTTPNotFound(text=f"no project {request.match_info['project']!r} on this backbone")
    return spec


async def read_json(request: web.Request, cls: type):
    if request.content_length is not None and request.content_length > MAX_JSON_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_JSON_BODY, actual_size=request.content_length,
                                            text=f"request body larger than {MAX_JSON_BODY} bytes")
    raw = await request.content.read(MAX_JSON_BODY + 1)
    if len(raw) > MAX_JSON_BODY:
        raise web.HTTPRequestEntityTooLarge(max_size=MAX_JSON_BODY, actual_size=len(raw),
                                            text=f"request body larger than {MAX_JSON_BODY} bytes")
    return decode_body(raw, cls)


def decode_body(raw: bytes, cls: type):
    import json

    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"request body is not JSON: {exc}") from None
    return from_dict(cls, data, "request")


def project_json(spec: ProjectSpec) -> dict:
    return dataclasses.asdict(spec)


@dataclass
class JoinRequest:
    name: str = ""
    version: str = ""

    def __post_init__(self) -> None:
        if len(self.name) > 64 or not self.name.isprintable():
            raise ValueError("name must be at most 64 printable characters")


def _authenticate_peer(request: web.Request, spec: ProjectSpec, peer_id: str) -> None:
    token = request.headers.get(PEER_TOKEN_HEADER, "")
    stored = _backbone(request).store.peer_token(peer_id, spec.id)
    offered = hashlib.sha256(token.encode()).hexdigest()
    if not token or stored is None or not hmac.compare_digest(stored, offered):
        raise web.HTTPUnauthorized(text="unknown peer or wrong peer token")


# --- routes -------------------------------------------------------------------------------

async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "version": __version__, "wire_version": WIRE_VERSION})


async def list_projects(request: web.Request) -> web.Response:
    backbone = _backbone(request)
    return web.json_response(
        {"projects": [backbone.project_summary(p) for p in backbone.projects.values()]}
    )


async def get_project(request: web.Request) -> web.Response:
    return web.json_response(_backbone(request).project_summary(_project(request)))


async def join(request: web.Request) -> web.Response:
    spec = _project(request)
    body = await read_json(request, JoinRequest)
    backbone = _backbone(request)
    peer_id, token = secrets.token_hex(8), secrets.token_urlsafe(32)
    name = body.name or f"peer-{peer_id[:6]}"
    backbone.store.add_peer(peer_id, spec.id, name, hashlib.sha256(token.encode()).hexdigest())
    log.info("%s: peer %s (%s) joined", spec.id, peer_id, name)
    return web.json_response(
        {
            "peer_id": peer_id,
            "token": token,
            "project": project_json(spec),
            "ice_servers": backbone.config.ice_servers,
            "report_interval": backbone.config.report_interval,
            "max_checkpoint_bytes": backbone.config.max_checkpoint_bytes,
        },
        status=201,
    )


async def peer_socket(request: web.Request) -> web.StreamResponse:
    spec = _project(request)
    backbone = _backbone(request)
    peer_id = request.match_info["peer"]
    _authenticate_peer(request, spec, peer_id)
    if peer_id in backbone.sessions:
        raise web.HTTPConflict(text="this peer is already connected")
    ws = web.WebSocketResponse(heartbeat=20, max_msg_size=MAX_CONTROL_MESSAGE)
    await ws.prepare(request)
    tracker = backbone.trackers[spec.id]
    session = PeerSession(peer_id, spec.id, peer_id, ws)
    backbone.sessions[peer_id] = session
    backbone.execute(spec.id, tracker.join(peer_id, peer_id))
    try:
        async for raw in ws:
            if raw.type == WSMsgType.TEXT:
                reason = _on_peer_message(backbone, spec.id, peer_id, raw.data)
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


def _on_peer_message(backbone: Backbone, project: str, peer_id: str, text: str) -> str | None:
    """Handle one control message; returns why the socket must close, or None."""
    try:
        msg = decode(text, CONTROL_TYPES)
    except ProtocolError as exc:
        return f"bad message: {exc}"
    if not isinstance(msg, PEER_MESSAGES):
        return f"peers may not send {msg.TYPE!r}"
    if isinstance(msg, Signal):
        target = backbone.sessions.get(msg.peer)
        if target is not None and target.project == project and msg.peer != peer_id:
            target.send(encode(Signal(peer_id, msg.data)))
        return None
    backbone.execute(project, backbone.trackers[project].handle(peer_id, msg))
    return None


async def curve(request: web.Request) -> web.Response:
    spec = _project(request)
    return web.json_response({"project": spec.id, "epochs": _backbone(request).store.curve(spec.id)})


async def list_checkpoints(request: web.Request) -> web.Response:
    spec = _project(request)
    saved = _backbone(request).store.checkpoints(spec.id)
    return web.json_response({"checkpoints": [dataclasses.asdict(info) for info, _ in saved]})


def _epoch(request: web.Request) -> int:
    text = request.match_info["epoch"]
    if not text.isdigit() or len(text) > 12:
        raise web.HTTPBadRequest(text="epoch must be a non-negative integer")
    return int(text)


async def get_checkpoint(request: web.Request) -> web.StreamResponse:
    spec = _project(request)
    backbone = _backbone(request)
    _authenticate_peer(request, spec, request.headers.get(PEER_ID_HEADER, ""))
    epoch = _epoch(request)
    for info, _ in backbone.store.checkpoints(spec.id):
        if info.epoch == epoch:
            return web.FileResponse(backbone.files.path(spec.id, epoch),
                                    headers={"X-Content-SHA256": info.sha256})
    raise web.HTTPNotFound(text=f"no checkpoint of epoch {epoch}")


async def put_checkpoint(request: web.Request) -> web.Response:
    spec = _project(request)
    backbone = _backbone(request)
    peer_id = request.headers.get(PEER_ID_HEADER, "")
    _authenticate_peer(request, spec, peer_id)
    epoch = _epoch(request)
    tracker = backbone.trackers[spec.id]
    if not tracker.expects_checkpoint(peer_id, epoch):
        raise web.HTTPConflict(text=f"no checkpoint of epoch {epoch} was requested from you")
    sha, params_sha = request.headers.get("X-Content-SHA256", ""), request.headers.get("X-Params-SHA256", "")
    if not SHA256.match(sha) or not SHA256.match(params_sha):
        raise web.HTTPBadRequest(text="X-Content-SHA256 and X-Params-SHA256 must be sha256 hex digests")
    expected = backbone.store.epoch_params(spec.id, epoch)
    if expected is None or expected != params_sha:
        raise web.HTTPConflict(text="parameter hash is not the collaboration's at that epoch")
    limit = backbone.config.max_checkpoint_bytes
    if request.content_length is not None and request.content_length > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=request.content_length,
                                            text=f"checkpoint larger than {limit} bytes")
    try:
        path, digest, size = await backbone.files.receive(
            spec.id, epoch, request.content.iter_chunked(1 << 16), expected_sha256=sha,
            expected_params_sha256=params_sha, max_bytes=limit,
        )
    except CheckpointRejected as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None
    info = CheckpointInfo(epoch, digest, params_sha, size, f"/api/projects/{spec.id}/checkpoints/{epoch}")
    backbone.checkpoint_stored(spec.id, peer_id, info, path)
    return web.json_response(dataclasses.asdict(info), status=201)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/api/health", health)
    app.router.add_get("/api/projects", list_projects)
    app.router.add_get("/api/projects/{project}", get_project)
    app.router.add_post("/api/projects/{project}/peers", join)
    app.router.add_get("/api/projects/{project}/peers/{peer}/ws", peer_socket)
    app.router.add_get("/api/projects/{project}/curve", curve)
    app.router.add_get("/api/projects/{project}/checkpoints", list_checkpoints)
    app.router.add_get("/api/projects/{project}/checkpoints/{epoch}", get_checkpoint)
    app.router.add_put("/api/projects/{project}/checkpoints/{epoch}", put_checkpoint)
