"""Property-based: hostile requests to every endpoint get an answer below 500, and the
refused ones change nothing on disk."""

import json
import sqlite3
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.backbone.routes import add_routes
from engine.wire import WIRE_VERSION
from tests.collab.harness import running_backbone, tiny_project

pytestmark = pytest.mark.slow

TABLES = ("users", "tokens", "peers", "steps", "contributions", "user_totals", "checkpoints",
          "collaborations")


def endpoints() -> list[tuple[str, str]]:
    from aiohttp import web

    app = web.Application()
    add_routes(app)
    return sorted({(r.method, r.resource.canonical) for r in app.router.routes() if r.method != "HEAD"})


# Real credentials too, filled in by the fixture, so requests also get past authentication.
USER_TOKEN, PEER_TOKEN, PEER_ID = "<user token>", "<peer token>", "<peer id>"
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=30,
)
bodies = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=300),
    st.fixed_dictionaries({"username": st.text(max_size=40), "password": st.text(max_size=40)})
    .map(lambda v: json.dumps(v).encode()),
)
path_values = st.one_of(st.sampled_from(["tiny-lm", "0", "1", "99999999999999", PEER_ID]),
                        st.text(min_size=1, max_size=30))
header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
headers = st.fixed_dictionaries({}, optional={
    "Authorization": st.one_of(header_values, header_values.map(lambda t: f"Bearer {t}"),
                               st.just(f"Bearer {USER_TOKEN}")),
    "X-Cotrain-Peer-Token": st.one_of(header_values, st.just(PEER_TOKEN)),
    "X-Cotrain-Peer-Id": st.one_of(header_values, st.just(PEER_ID)),
    "X-Content-SHA256": st.sampled_from(["0" * 64, "zz"]),
    "X-State-SHA256": st.sampled_from(["0" * 64, ""]),
})
queries = st.dictionaries(st.sampled_from(["limit", "offset", "x"]), st.text(max_size=8), max_size=3)


def snapshot(db_path, data_dir, volatile: dict[str, str] | None = None) -> tuple:
    """Every row of every table, and the checkpoint files. ``volatile`` names, per table,
    the columns that may change legitimately (a socket's own connection times)."""
    volatile = volatile or {}
    with sqlite3.connect(db_path) as db:
        rows = []
        for table in TABLES:
            columns = [c[1] for c in db.execute(f"PRAGMA table_info({table})")
                       if c[1] not in volatile.get(table, "").split()]
            rows.append(db.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY 1, 2").fetchall())
    folder = data_dir / "checkpoints"
    files = sorted(str(p) for p in folder.rglob("*")) if folder.exists() else []
    return tuple(map(tuple, rows)), tuple(files)


@pytest.fixture
async def backbone(tmp_path):
    async with running_backbone(tmp_path, tiny_project()) as bb, aiohttp.ClientSession() as http:
        bb.http, bb.data_dir = http, tmp_path
        account = {"username": "fuzz", "password": "pw-fuzz-123"}
        async with http.post(f"{bb.url}/api/accounts", json=account) as r:
            user = (await r.json())["token"]
        async with http.post(f"{bb.url}/api/projects/tiny-lm/peers", json={"name": "f", "wire": WIRE_VERSION},
                             headers={"Authorization": f"Bearer {user}"}) as r:
            peer = await r.json()
        bb.secrets = {USER_TOKEN: user, PEER_TOKEN: peer["token"], PEER_ID: peer["peer_id"]}
        yield bb
        async with http.get(f"{bb.url}/api/health") as resp:
            assert resp.status == 200


@pytest.mark.parametrize("method, template", endpoints())
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, header=headers, query=queries, params=st.lists(path_values, min_size=3, max_size=3))
async def test_hostile_requests_never_cause_a_server_error(backbone, method, template, body, header, query,
                                                           params):
    def real(text: str) -> str:
        for placeholder, secret in backbone.secrets.items():
            text = text.replace(placeholder, secret)
        return text

    path = template
    for name, value in zip(("{project}", "{peer}", "{epoch}"), params, strict=True):
        path = path.replace(name, quote(real(value), safe=""))
    header = {key: real(value) for key, value in header.items()}
    db_path = backbone.data_dir / "backbone.sqlite3"
    before = snapshot(db_path, backbone.data_dir)
    async with backbone.http.request(method, backbone.url + path, data=body, headers=header,
                                     params=query) as resp:
        status, text = resp.status, await resp.text()
    event(f"HTTP {status}")  # --hypothesis-show-statistics: how far requests got
    assert status < 500, (method, path, status, text)
    if status >= 400:
        assert snapshot(db_path, backbone.data_dir) == before, (method, path, status, text)
        if text:
            assert "error" in json.loads(text)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(messages=st.lists(st.one_of(json_values.map(json.dumps), st.text(max_size=80),
                                   st.sampled_from(['{"v":1,"type":"progress","epoch":0,"samples":-5,'
                                                    '"samples_per_second":1}',
                                                    '{"v":1,"type":"signal","peer":"x","data":[]}'])),
                         min_size=1, max_size=4))
async def test_hostile_control_messages_close_the_socket_or_are_ignored(tmp_path_factory, messages):
    tmp = tmp_path_factory.mktemp("ws")
    async with running_backbone(tmp, tiny_project()) as backbone, aiohttp.ClientSession() as http:
        join = {"wire": WIRE_VERSION}
        async with http.post(f"{backbone.url}/api/projects/tiny-lm/peers", json=join) as resp:
            joined = await resp.json()
        before = snapshot(tmp / "backbone.sqlite3", tmp, {"peers": "connected_at last_seen left_at"})
        ws = await http.ws_connect(f"{backbone.url}/api/projects/tiny-lm/peers/{joined['peer_id']}/ws",
                                   headers={"X-Cotrain-Peer-Token": joined["token"]})
        for text in messages:
            if ws.closed:
                break
            await ws.send_str(text)
        await ws.close()
        tracker = backbone.trackers["tiny-lm"]
        assert tracker.epoch == 0 and tracker.round is None
        connection_times = {"peers": "connected_at last_seen left_at"}
        assert snapshot(tmp / "backbone.sqlite3", tmp, connection_times) == before
        async with http.get(f"{backbone.url}/api/health") as resp:
            assert resp.status == 200
