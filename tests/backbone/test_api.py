"""Bad input to the backbone: clear 4xx answers or a closed socket with a reason, while
the server stays up and the peers already training are unaffected."""

import asyncio
import json
import re

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.wire import WIRE_VERSION
from engine.wire.codec import encode_text
from engine.wire.control import Ping, Pong, from_backbone
from engine.wire.rest import PROBE_BYTES
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project
from tests.conftest import until

pytestmark = pytest.mark.slow


async def _join(http, url, project="tiny-lm"):
    body = {"name": "x", "wire": WIRE_VERSION}
    async with http.post(f"{url}/api/projects/{project}/peers", json=body) as resp:
        assert resp.status == 201
        return await resp.json()


@pytest.fixture
async def collaboration(tmp_path):
    project = tiny_project()
    async with running_backbone(tmp_path, project) as backbone:
        peers = [start_peer(backbone.url, project.id, f"p{i}") for i in range(2)]
        await peers[0].reached(1, timeout=60)
        async with aiohttp.ClientSession() as http:
            yield backbone, http, peers
        await stop_all(*peers)


@pytest.mark.parametrize(
    "method, path, body, status, message",
    [
        ("post", "/api/projects/tiny-lm/peers", b"{not json", 400, "not valid JSON"),
        ("post", "/api/projects/tiny-lm/peers", b'{"name": 42}', 400, "Expected `str`, got `int`"),
        ("post", "/api/projects/tiny-lm/peers", b"[1, 2]", 400, "Expected `object`"),
        ("post", "/api/projects/tiny-lm/peers", b'{"name": "' + b"x" * 200 + b'"}', 400, "64"),
        ("post", "/api/projects/tiny-lm/peers", b'{"name": "old peer"}', 400,
         f"please update Cotrain (wire v1, backbone speaks v{WIRE_VERSION})"),
        ("post", "/api/projects/nope/peers", b"{}", 404, "no project 'nope'"),
        ("get", "/api/projects/nope/curve", None, 404, "no project"),
        ("post", "/api/projects/tiny-lm/peers", b"{" + b" " * 100_000 + b"}", 413, "larger than"),
        ("get", "/api/projects/tiny-lm/checkpoints/abc", None, 401, "peer token"),
        ("put", "/api/projects/tiny-lm/checkpoints/3", b"data", 401, "peer token"),
        ("get", "/api/projects/tiny-lm/peers/abc/ws", None, 401, "peer token"),
    ],
)
async def test_bad_requests_get_a_clear_4xx(collaboration, method, path, body, status, message):
    backbone, http, peers = collaboration
    async with http.request(method, backbone.url + path, data=body) as resp:
        assert resp.status == status
        assert message in (await resp.json())["error"]
    async with http.get(f"{backbone.url}/api/health") as resp:
        assert resp.status == 200
    await peers[0].reached(peers[0].history[-1].step.epoch + 1, timeout=60)


@pytest.mark.parametrize(
    "frame, reason",
    [
        ("this is not json", "bad message: control message is not valid JSON"),
        ('{"type": "progress", "epoch": "x"}', "Expected `int`, got `str`"),
        (f'{{"v": {WIRE_VERSION + 1}, "type": "progress"}}', f"wire v{WIRE_VERSION + 1}, backbone speaks"),
        ('{"type": "round_start", "round_id": 1, "epoch": 0, "group": ["a"], '
         '"shares": [1], "timeout": 1}', "Invalid value 'round_start'"),
        (b"\x00\x01binary", "binary messages are not accepted"),
    ],
)
async def test_a_socket_sending_garbage_is_closed_with_the_reason(collaboration, frame, reason):
    backbone, http, peers = collaboration
    joined = await _join(http, backbone.url)
    ws = await http.ws_connect(f"{backbone.url}/api/projects/tiny-lm/peers/{joined['peer_id']}/ws",
                               headers={"X-Cotrain-Peer-Token": joined["token"]})
    if isinstance(frame, bytes):
        await ws.send_bytes(frame)
    else:
        await ws.send_str(frame)
    msg = await ws.receive(timeout=10)
    while msg.type == aiohttp.WSMsgType.TEXT:  # status broadcasts may come first
        msg = await ws.receive(timeout=10)
    assert msg.type == aiohttp.WSMsgType.CLOSE
    assert reason in msg.extra
    epoch = peers[0].history[-1].step.epoch
    await peers[0].reached(epoch + 1, timeout=60)


async def test_a_wrong_peer_token_is_refused(collaboration):
    backbone, http, _ = collaboration
    joined = await _join(http, backbone.url)
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:
        await http.ws_connect(f"{backbone.url}/api/projects/tiny-lm/peers/{joined['peer_id']}/ws",
                              headers={"X-Cotrain-Peer-Token": "forged"})
    assert err.value.status == 401


async def test_two_sockets_for_one_peer_at_once_leave_exactly_one_connected(collaboration):
    """Both upgrades pass the first check together: the second is closed, and the first
    keeps its session (before, the loser's exit removed the winner's)."""
    backbone, http, _ = collaboration
    joined = await _join(http, backbone.url)
    url = f"{backbone.url}/api/projects/tiny-lm/peers/{joined['peer_id']}/ws"
    headers = {"X-Cotrain-Peer-Token": joined["token"]}
    results = await asyncio.gather(*(http.ws_connect(url, headers=headers) for _ in range(4)),
                                   return_exceptions=True)
    opened = [ws for ws in results if isinstance(ws, aiohttp.ClientWebSocketResponse)]
    refused = [err for err in results if isinstance(err, aiohttp.WSServerHandshakeError)]
    closed, alive = [], []
    for ws in opened:
        msg = await ws.receive(timeout=10)
        (closed if msg.type == aiohttp.WSMsgType.CLOSE else alive).append((ws, msg))
    assert len(alive) == 1 and len(closed) + len(refused) == 3, (alive, closed, refused)
    assert all("already connected" in msg.extra for _, msg in closed)
    assert all(err.status == 409 for err in refused)
    assert joined["peer_id"] in backbone.sessions
    ws = alive[0][0]
    await ws.send_str(encode_text(Ping(7)))
    while (msg := await ws.receive(timeout=10)).type == aiohttp.WSMsgType.TEXT:
        if isinstance(reply := from_backbone.decode(msg.data), Pong):
            break
    assert reply == Pong(7), "the socket left connected is not served"
    await ws.close()


def _upload_headers(joined: dict, state_sha256: str) -> dict[str, str]:
    """A checkpoint upload's headers, of bytes that are not what they say."""
    return {"X-Cotrain-Peer-Token": joined["token"], "X-Cotrain-Peer-Id": joined["peer_id"],
            "X-Content-SHA256": "0" * 64, "X-State-SHA256": state_sha256}


async def test_checkpoint_uploads_nobody_asked_for_are_refused(collaboration):
    backbone, http, _ = collaboration
    joined = await _join(http, backbone.url)
    headers = _upload_headers(joined, "0" * 64)
    async with http.put(f"{backbone.url}/api/projects/tiny-lm/checkpoints/1", data=b"x" * 1000,
                        headers=headers) as resp:
        assert resp.status == 409
        assert "was requested from you" in (await resp.json())["error"]
    assert backbone.store.checkpoints.listed("tiny-lm") == []


async def test_an_asked_for_checkpoint_upload_that_fails_frees_the_chore(collaboration):
    """The backbone waits for an asked-for checkpoint while its upload runs; one that fails
    (here: its bytes are not what it said) is not waited for, and the next goes to another."""
    backbone, http, _ = collaboration
    joined = await _join(http, backbone.url)
    tracker = backbone.trackers["tiny-lm"]
    epoch = 1
    state = backbone.store.rounds.epoch_state("tiny-lm", epoch)
    assert state is not None
    tracker.checkpoint_requests.ask(joined["peer_id"], epoch)
    assert joined["peer_id"] in tracker.checkpoint_requests.uploading()
    headers = _upload_headers(joined, state)
    async with http.put(f"{backbone.url}/api/projects/tiny-lm/checkpoints/{epoch}", data=b"x" * 1000,
                        headers=headers) as resp:
        assert resp.status == 400, await resp.text()
    assert not tracker.expects_checkpoint(joined["peer_id"], epoch)
    assert joined["peer_id"] not in tracker.checkpoint_requests.uploading()


async def test_an_asked_for_checkpoint_of_another_state_frees_the_chore(collaboration):
    """An asked peer whose state is not the collaboration's at that epoch is refused, and
    its chore goes to the next round's peer at once, not after five minutes' patience."""
    backbone, http, _ = collaboration
    joined = await _join(http, backbone.url)
    tracker = backbone.trackers["tiny-lm"]
    tracker.checkpoint_requests.ask(joined["peer_id"], 1)
    headers = _upload_headers(joined, "1" * 64)
    async with http.put(f"{backbone.url}/api/projects/tiny-lm/checkpoints/1", data=b"x" * 1000,
                        headers=headers) as resp:
        assert resp.status == 409 and "not the collaboration's" in (await resp.json())["error"]
    assert joined["peer_id"] not in tracker.checkpoint_requests.uploading()
    assert tracker.checkpoint_requests.failures(joined["peer_id"]) == 1
    assert backbone.store.checkpoints.listed("tiny-lm") == []


async def test_a_checkpoint_of_an_epoch_still_to_settle_is_refused_and_still_owed(collaboration):
    """A peer asked for epoch 1 whose snapshot is a step on (rounds outran it), uploading it
    before that step settled: told to upload once it has, with the chore still its own and no
    failure counted against it."""
    backbone, http, _ = collaboration
    joined = await _join(http, backbone.url)
    tracker = backbone.trackers["tiny-lm"]
    later = tracker.epoch + 1000  # (the peers step on meanwhile)
    tracker.checkpoint_requests.ask(joined["peer_id"], 1)
    headers = _upload_headers(joined, "1" * 64)
    async with http.put(f"{backbone.url}/api/projects/tiny-lm/checkpoints/{later}", data=b"x" * 1000,
                        headers=headers) as resp:
        assert resp.status == 409 and "not settled yet" in (await resp.json())["error"]
        assert resp.headers["Retry-After"] == "1"
    assert tracker.expects_checkpoint(joined["peer_id"], later)
    assert tracker.checkpoint_requests.failures(joined["peer_id"]) == 0


async def test_link_probes_are_for_peers_bounded_and_few(collaboration):
    backbone, http, peers = collaboration
    url = f"{backbone.url}/api/projects/tiny-lm/probe"
    async with http.post(url, data=b"x" * 1000) as resp:
        assert resp.status == 401
    joined = await _join(http, backbone.url)
    headers = {"X-Cotrain-Peer-Token": joined["token"], "X-Cotrain-Peer-Id": joined["peer_id"]}
    async with http.get(f"{url}?bytes=1000", headers=headers) as resp:  # ids are cheap: not connected
        assert resp.status == 409 and "connected" in (await resp.json())["error"]
    ws = await http.ws_connect(f"{backbone.url}/api/projects/tiny-lm/peers/{joined['peer_id']}/ws",
                               headers=headers)
    await until(lambda: joined["peer_id"] in backbone.sessions, 10, "the socket to open")
    async with http.get(f"{url}?bytes=%C2%B2", headers=headers) as resp:  # a digit to isdigit(), not to int()
        assert resp.status == 400
    async with http.get(f"{url}?bytes={PROBE_BYTES + 1}", headers=headers) as resp:
        assert resp.status == 400 and "bytes" in (await resp.json())["error"]
    async with http.get(f"{url}?bytes=100000", headers=headers) as resp:
        assert resp.status == 200 and len(await resp.read()) == 100_000
    async with http.post(url, data=b"x" * (PROBE_BYTES + 1), headers=headers) as resp:
        assert resp.status == 413
    async with http.post(url, data=b"x" * 5000, headers=headers) as resp:
        assert resp.status == 200 and (await resp.json())["received"] == 5000
    async with http.get(f"{url}?bytes=10", headers=headers) as resp:  # the fourth probe: the burst
        assert resp.status == 200
    async with http.post(url, data=b"x", headers=headers) as resp:  # the burst is spent
        assert resp.status == 429 and "try again" in (await resp.json())["error"]
    await ws.close()
    # The peers probed their links when they joined, and report what they achieve.
    members = backbone.trackers["tiny-lm"].members.peers
    ids = [p.peer.peer_id for p in peers]
    await until(lambda: all(members[i].upload and members[i].download for i in ids), 30, "link reports")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=json_values)
async def test_hostile_join_bodies_never_cause_a_server_error(collaboration, body):
    backbone, http, _ = collaboration
    async with http.post(f"{backbone.url}/api/projects/tiny-lm/peers", data=json.dumps(body)) as resp:
        assert resp.status in (201, 400)


async def test_a_peer_meeting_a_backbone_of_another_wire_is_told_who_must_update(tmp_path):
    """Releases move on: a backbone answering the join with another wire version (a newer one
    here, or an old one that does not say) stops the peer with a sentence, not a crash."""
    from aiohttp import web

    from engine.peer.client import BackboneError, ControlClient
    from engine.wire.codec import encode
    from engine.wire.rest import JoinReply

    def backbone_speaking(wire: int):
        async def join(request: web.Request) -> web.Response:
            reply = JoinReply(peer_id="p1", token="t", project=tiny_project(), ice_servers=[],
                              wire_version=wire)
            return web.Response(body=encode(reply), status=201, content_type="application/json")
        return join

    for wire, says in ((WIRE_VERSION + 1, f"please update Cotrain (wire v{WIRE_VERSION}, backbone speaks "
                                          f"v{WIRE_VERSION + 1})"),
                       (1, "its owner must update it")):
        app = web.Application()
        app.router.add_post("/api/projects/tiny-lm/peers", backbone_speaking(wire))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        client = ControlClient(f"http://127.0.0.1:{port}", "tiny-lm", "newcomer")
        try:
            with pytest.raises(BackboneError, match=re.escape(says)) as refused:
                await client.join()
            assert refused.value.fatal
        finally:
            await client.close()
            await runner.cleanup()


async def test_a_control_socket_that_breaks_as_a_ping_arrives_ends_the_messages_and_raises_nothing():
    """The backbone pings, and its socket dies before the answer can go: the peer reads that
    as a lost connection (and reconnects), not as an error that ends it. (Twelve peers on a
    loaded machine all exited with "Cannot write to closing transport" this way.)"""
    from aiohttp import web

    from engine.peer.client import ControlClient
    from engine.wire.codec import encode
    from engine.wire.rest import JoinReply

    pinged = asyncio.Event()

    async def join(request: web.Request) -> web.Response:
        reply = JoinReply(peer_id="p1", token="t", project=tiny_project(), ice_servers=[],
                          wire_version=WIRE_VERSION)
        return web.Response(body=encode(reply), status=201, content_type="application/json")

    async def control(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(autoping=False)
        await ws.prepare(request)
        await ws.ping()
        assert request.transport is not None
        request.transport.abort()
        pinged.set()
        return ws

    app = web.Application()
    app.router.add_post("/api/projects/tiny-lm/peers", join)
    app.router.add_get("/api/projects/tiny-lm/peers/p1/ws", control)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    client = ControlClient(f"http://127.0.0.1:{runner.addresses[0][1]}", "tiny-lm", "pinged")
    try:
        await client.join()
        await client.connect()
        await asyncio.wait_for(pinged.wait(), 10)
        ws = client._ws
        assert ws is not None
        await until(lambda: ws._response.connection is None or ws._writer.transport.is_closing(), 10,
                    "the socket to close under the peer")
        received = await asyncio.wait_for(_all(client.messages()), 10)
        assert received == [] and not client.connected
    finally:
        await client.close()
        await runner.cleanup()


async def _all(messages) -> list:
    return [m async for m in messages]
