"""/api/openapi.json tells the truth: every route is described, and every request sent and
every answer given during a real collaboration -- peers, accounts, checkpoints, refusals --
validates against the description the backbone serves."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
from aiohttp import web
from jsonschema import Draft202012Validator

from engine.backbone import server as server_module
from engine.backbone.openapi import published_path
from engine.backbone.routes import ROUTES
from engine.wire import WIRE_VERSION
from engine.wire.rest import PEER_ID_HEADER, PEER_TOKEN_HEADER
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.projects import albert_folder

pytestmark = pytest.mark.slow


@pytest.fixture
def exchanges(monkeypatch):
    """Every request the backbone answers from now on: (method, route, status, request body,
    answer, answer's media type)."""
    seen: list[tuple[str, str, int, bytes, bytes, str]] = []

    @web.middleware
    async def record(request: web.Request, handler):
        json_body = request.content_type == "application/json" and request.can_read_body
        body = await request.read() if json_body else b""  # a handler reading it gets it again
        response = await handler(request)
        resource = request.match_info.route.resource
        route = published_path(resource.canonical) if resource else "?"
        raw = isinstance(response, web.Response) and isinstance(response.body, bytes)
        answer = response.body if raw else b""
        seen.append((request.method, route, response.status, body, answer, response.content_type))
        return response

    real_app = server_module.Backbone.app

    def app_with_recording(self):
        app = real_app(self)
        app.middlewares.append(record)
        return app

    monkeypatch.setattr(server_module.Backbone, "app", app_with_recording)
    return seen


def validator(doc: dict, schema: dict) -> Draft202012Validator:
    """Validates against ``schema`` with the document's components in reach of its $refs."""
    return Draft202012Validator({**schema, "components": doc["components"]})


def assert_all_described(doc: dict, exchanges: list[tuple[str, str, int, bytes, bytes, str]]) -> None:
    """The document describes exactly the routes the backbone serves, the collaboration
    exercised every one, and every request body and answer it saw validates against them."""
    declared = {(r.method, published_path(r.path)) for r in ROUTES}
    assert set(doc["paths"]) == {published_path(r.path) for r in ROUTES}
    assert {(m.upper(), path) for path, ops in doc["paths"].items() for m in ops} == declared
    exercised = {(method, route) for method, route, *_ in exchanges}
    assert exercised >= declared, f"not exercised: {declared - exercised}"
    for method, route, status, body, answer, media in exchanges:
        operation = doc["paths"][route][method.lower()]
        assert str(status) in operation["responses"], (method, route, status, answer[:300])
        described = operation["responses"][str(status)].get("content", {})
        if media == "application/json" and route != "/api/openapi.json":
            schema = described["application/json"]["schema"]
            validator(doc, schema).validate(json.loads(answer))
        if body and "requestBody" in operation and 200 <= status < 300:
            content = operation["requestBody"]["content"]
            if "application/json" in content:
                validator(doc, content["application/json"]["schema"]).validate(json.loads(body))


async def test_every_request_and_answer_matches_the_published_api(tmp_path, exchanges):
    project = tiny_project(checkpoint_every=1, keep_checkpoints=2)
    albert = albert_folder(tmp_path / "projects")  # a project with files
    async with running_backbone(tmp_path / "bb", project, projects_dir=albert.root.parent) as bb, \
            aiohttp.ClientSession() as http:
        url = bb.url

        async def call(method, path, body=None, headers=None, raw=None):
            data = raw if raw is not None else (json.dumps(body) if body is not None else None)
            kind = {"Content-Type": "application/json"} if raw is None else {}
            async with http.request(method, url + path, data=data, headers={**kind, **(headers or {})}) \
                    as resp:
                return resp.status, await resp.read()

        assert (await call("POST", "/api/accounts", {"username": "ana", "password": "pass-word-1"}))[0] == 201
        await call("POST", "/api/accounts", {"username": "ana", "password": "pass-word-1"})  # 409
        await call("POST", "/api/accounts", {"username": "a", "password": "x"})  # 400
        _, login = await call("POST", "/api/sessions", {"username": "ana", "password": "pass-word-1"})
        await call("POST", "/api/sessions", {"username": "ana", "password": "wrong"})  # 401
        user_token = json.loads(login)["token"]
        token = {"Authorization": f"Bearer {user_token}"}
        peer = start_peer(url, project.id, "real-peer", max_epochs=3, user_token=user_token)
        try:
            assert await peer.finish(timeout=90) == "reached epoch 3"
        finally:
            await stop_all(peer)
        _, doc_bytes = await call("GET", "/api/openapi.json")
        doc = json.loads(doc_bytes)
        await call("GET", "/api/health")
        await call("GET", "/api/me", headers=token)
        await call("GET", "/api/me")  # 401
        await call("GET", "/api/projects")
        await call("GET", f"/api/projects/{project.id}")
        await call("GET", "/api/projects/nope")  # 404
        join = {"name": "n", "wire": WIRE_VERSION}
        _, joined = await call("POST", f"/api/projects/{project.id}/peers", join)
        await call("POST", f"/api/projects/{project.id}/peers", {"name": 5})  # 400
        await call("POST", "/api/projects/nope/peers", {"wire": WIRE_VERSION})  # 404
        identity = json.loads(joined)
        peer_headers = {PEER_ID_HEADER: identity["peer_id"], PEER_TOKEN_HEADER: identity["token"]}
        shard = f"/api/projects/albert-mini/files/{albert.spec.data.shards[0].path}"
        assert (await call("GET", shard))[0] == 200
        whole = (albert.root / albert.spec.data.shards[0].path).read_bytes()
        assert (await call("GET", shard, headers={"Range": "bytes=5-9"})) == (206, whole[5:10])
        await call("GET", "/api/projects/albert-mini/files/project.json")  # 404: not in its manifest
        await call("GET", f"/api/projects/{project.id}/curve")
        await call("GET", f"/api/projects/{project.id}/leaderboard?limit=10&offset=0")
        await call("GET", f"/api/projects/{project.id}/leaderboard?limit=0")  # 400
        _, listed = await call("GET", f"/api/projects/{project.id}/checkpoints")
        epoch = json.loads(listed)["checkpoints"][0]["epoch"]
        checkpoint = f"/api/projects/{project.id}/checkpoints/{epoch}"
        assert (await call("GET", checkpoint, headers=peer_headers))[0] == 409  # not connected
        ws = await http.ws_connect(f"{url}/api/projects/{project.id}/peers/{peer_headers[PEER_ID_HEADER]}/ws",
                                   headers=peer_headers)
        assert (await call("GET", checkpoint, headers=peer_headers))[0] == 200
        await call("GET", f"/api/projects/{project.id}/checkpoints/999", headers=peer_headers)  # 404
        await call("GET", checkpoint, headers=peer_headers)
        assert (await call("GET", checkpoint, headers=peer_headers))[0] == 429  # a few a minute
        await call("GET", checkpoint)  # 401
        await call("PUT", f"/api/projects/{project.id}/checkpoints/9", raw=b"x", headers=peer_headers)  # 409
        await ws.close()
        await call("POST", "/api/sessions", {"username": "ana", "password": "pass-word-1"})  # a second log-in
        _, sessions = await call("GET", "/api/sessions", headers=token)
        other = next(s["id"] for s in json.loads(sessions)["sessions"] if not s["current"])
        await call("DELETE", f"/api/sessions/{other}", headers=token)
        await call("DELETE", "/api/sessions/999999", headers=token)  # 404
        await call("DELETE", "/api/sessions", headers=token)
        await call("DELETE", "/api/sessions")  # 401

    assert_all_described(doc, exchanges)
    assert any(status == 201 and method == "PUT" for method, _, status, *_ in exchanges), \
        "the real peer's checkpoint upload was answered and checked"
    board = next(json.loads(a) for m, r, s, _, a, _ in exchanges if r.endswith("/leaderboard") and s == 200)
    assert board["entries"][0]["username"] == "ana"  # the answers checked above carried real rows
    assert re.fullmatch(r"3\.1\.\d+", doc["openapi"])
