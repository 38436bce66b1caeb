"""The backbone's routes. Every input is validated; errors are JSON ``{"error": "..."}``
with a 4xx status, and nothing a client sends can take the server down."""

from __future__ import annotations

from aiohttp import web

from engine import __version__
from engine.backbone import api_accounts, api_checkpoints, api_projects, openapi
from engine.wire import WIRE_VERSION


async def health(request: web.Request) -> web.Response:
    return web.json_response({"ok": True, "version": __version__, "wire_version": WIRE_VERSION})


async def openapi_json(request: web.Request) -> web.Response:
    return web.json_response(openapi.spec())


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/health", health)
    r.add_get("/api/openapi.json", openapi_json)
    r.add_post("/api/accounts", api_accounts.register)
    r.add_post("/api/sessions", api_accounts.login)
    r.add_delete("/api/sessions", api_accounts.logout)
    r.add_get("/api/me", api_accounts.me)
    r.add_get("/api/projects", api_projects.list_projects)
    r.add_get("/api/projects/{project}", api_projects.get_project)
    r.add_post("/api/projects/{project}/peers", api_projects.join)
    r.add_get("/api/projects/{project}/peers/{peer}/ws", api_projects.peer_socket)
    r.add_get("/api/projects/{project}/curve", api_projects.curve)
    r.add_get("/api/projects/{project}/leaderboard", api_projects.leaderboard)
    r.add_get("/api/projects/{project}/checkpoints", api_checkpoints.list_checkpoints)
    r.add_get("/api/projects/{project}/checkpoints/{epoch}", api_checkpoints.get_checkpoint)
    r.add_put("/api/projects/{project}/checkpoints/{epoch}", api_checkpoints.put_checkpoint)
