"""The backbone's routes, in one table from which both aiohttp's router and
/api/openapi.json are built, so the published API is the one served.

Every input is validated; errors are JSON ``{"error": "..."}`` (ErrorReply) with a 4xx
status, and nothing a client sends can take the server down.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from engine import __version__
from engine.backbone import api_accounts, api_checkpoints, api_files, api_probe, api_projects, openapi
from engine.backbone.api_projects import BY, LIMIT, OFFSET, QueryInt, QueryRanking
from engine.backbone.http import Handler, backbone_of, json_reply
from engine.backbone.openapi import RawBody
from engine.wire import WIRE_VERSION
from engine.wire.control import CheckpointInfo
from engine.wire.rest import (
    CheckpointList,
    Curve,
    ErrorReply,
    Health,
    JoinReply,
    JoinRequest,
    Leaderboard,
    LoginReply,
    LoginRequest,
    Me,
    ProbeReply,
    ProjectList,
    ProjectSummary,
    RegisterRequest,
    Revoked,
    SessionList,
)

STATE_FILE = RawBody("application/octet-stream", "a state file (engine/wire/tensors.py)")


class Auth(Enum):
    NONE = "none"
    USER = "user"  # Authorization: Bearer <token of a log-in>
    OPTIONAL_USER = "optional user"  # anonymous, or a user
    PEER = "peer"  # X-Cotrain-Peer-Id and X-Cotrain-Peer-Token from the join


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    replies: dict[int, type | RawBody | str]  # status -> the Struct answered, a raw body, or what happens
    body: type | RawBody | None = None
    auth: Auth = Auth.NONE
    query: tuple[QueryInt | QueryRanking, ...] = ()
    # Served by the process that runs the project's tracker (its connected peers are
    # there); another backbone process on the database forwards it (leases.py).
    tracker: bool = False

    def __post_init__(self) -> None:
        if self.tracker:  # forwarded while the project's lease changes hands: "try again"
            object.__setattr__(self, "replies", {**self.replies, 503: ErrorReply})


async def health(request: web.Request) -> web.Response:
    return json_reply(Health(True, __version__, WIRE_VERSION))


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi.spec(ROUTES))


_PROJECT = "/api/projects/{project}"
ROUTES: tuple[Route, ...] = (
    Route("GET", "/api/health", health, "Liveness and versions", {200: Health}),
    Route("GET", "/api/openapi.json", openapi_json, "This description (OpenAPI 3.1)",
          {200: RawBody("application/json", "the OpenAPI document")}),
    Route("POST", "/api/accounts", api_accounts.register, "Create an account and log in",
          {201: LoginReply, 400: ErrorReply, 408: ErrorReply, 409: ErrorReply, 429: ErrorReply},
          body=RegisterRequest),
    Route("POST", "/api/sessions", api_accounts.login, "Log in: a new token",
          {200: LoginReply, 400: ErrorReply, 401: ErrorReply, 408: ErrorReply, 429: ErrorReply},
          body=LoginRequest),
    Route("DELETE", "/api/sessions", api_accounts.logout, "Log out: revoke the presented token",
          {200: Revoked, 401: ErrorReply}, auth=Auth.USER),
    Route("GET", "/api/sessions", api_accounts.list_sessions, "My log-ins: client, created, last used",
          {200: SessionList, 401: ErrorReply}, auth=Auth.USER),
    Route("DELETE", "/api/sessions/{session}", api_accounts.revoke_session, "Log one of my sessions out",
          {200: Revoked, 401: ErrorReply, 404: ErrorReply}, auth=Auth.USER),
    Route("GET", "/api/me", api_accounts.me, "My totals per project and contribution per hour",
          {200: Me, 401: ErrorReply}, auth=Auth.USER),
    Route("GET", "/api/projects", api_projects.list_projects, "The catalog with live progress",
          {200: ProjectList}),
    Route("GET", _PROJECT, api_projects.get_project, "One project with live progress",
          {200: ProjectSummary, 404: ErrorReply}),
    Route("POST", f"{_PROJECT}/peers", api_projects.join,
          "Join as a peer: peer id, peer token, project and ICE servers",
          {201: JoinReply, 400: ErrorReply, 401: ErrorReply, 404: ErrorReply, 408: ErrorReply,
           429: ErrorReply},
          body=JoinRequest,
          auth=Auth.OPTIONAL_USER),
    Route("GET", f"{_PROJECT}/peers/{{peer}}/ws", api_projects.peer_socket,
          "The peer's control WebSocket (engine/wire/control.py)",
          {101: "switching to the WebSocket", 401: ErrorReply, 404: ErrorReply, 409: ErrorReply,
           429: ErrorReply},
          auth=Auth.PEER, tracker=True),
    Route("POST", f"{_PROJECT}/probe", api_probe.probe_upload,
          "Measure this peer's upload: the backbone takes the bytes sent",
          {200: ProbeReply, 401: ErrorReply, 404: ErrorReply, 408: ErrorReply, 409: ErrorReply,
           413: ErrorReply, 429: ErrorReply},
          body=RawBody("application/octet-stream", "any bytes"), auth=Auth.PEER, tracker=True),
    Route("GET", f"{_PROJECT}/probe", api_probe.probe_download,
          "Measure this peer's download: the backbone sends the bytes asked for",
          {200: RawBody("application/octet-stream", "the bytes asked for"), 400: ErrorReply, 401: ErrorReply,
           404: ErrorReply, 409: ErrorReply, 429: ErrorReply}, auth=Auth.PEER, query=(api_probe.SIZE,),
          tracker=True),
    Route("GET", f"{_PROJECT}/curve", api_projects.curve, "Loss per epoch", {200: Curve, 404: ErrorReply}),
    Route("GET", f"{_PROJECT}/leaderboard", api_projects.leaderboard,
          "Credited samples (or bytes aggregated) per user, best first",
          {200: Leaderboard, 400: ErrorReply, 404: ErrorReply}, query=(LIMIT, OFFSET, BY)),
    Route("GET", f"{_PROJECT}/files/{{path:.+}}", api_files.project_file,
          "A file the project's manifest names (a shard, the tokenizer); Range requests resume",
          {200: RawBody("application/octet-stream", "the file"),
           206: RawBody("application/octet-stream", "a range of it"),
           401: ErrorReply, 404: ErrorReply, 416: ErrorReply}, auth=Auth.OPTIONAL_USER),
    Route("GET", f"{_PROJECT}/checkpoints", api_checkpoints.list_checkpoints, "Stored checkpoints",
          {200: CheckpointList, 404: ErrorReply}),
    Route("GET", f"{_PROJECT}/checkpoints/{{epoch}}", api_checkpoints.get_checkpoint,
          "Download a checkpoint (connected peers, a few a minute)",
          {200: STATE_FILE, 400: ErrorReply, 401: ErrorReply, 404: ErrorReply, 409: ErrorReply,
           429: ErrorReply}, auth=Auth.PEER, tracker=True),
    Route("PUT", f"{_PROJECT}/checkpoints/{{epoch}}", api_checkpoints.put_checkpoint,
          "Upload a checkpoint the backbone asked for (peers)",
          {201: CheckpointInfo, 400: ErrorReply, 401: ErrorReply, 404: ErrorReply, 409: ErrorReply,
           413: ErrorReply}, body=STATE_FILE, auth=Auth.PEER, tracker=True),
)


def add_routes(app: web.Application) -> None:
    for route in ROUTES:
        app.router.add_route(route.method, route.path, _at_tracker(route) if route.tracker else route.handler)


def _at_tracker(route: Route) -> Handler:
    socket = route.path.endswith("/ws")

    async def handler(request: web.Request) -> web.StreamResponse:
        backbone = backbone_of(request)
        project = request.match_info["project"]
        if project in backbone.projects and project not in backbone.trackers:
            return await backbone.forward(request, project, socket)
        return await route.handler(request)

    return handler
