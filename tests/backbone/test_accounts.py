"""Accounts and tokens, against a real backbone on loopback."""

import logging
import stat
import time

import aiohttp
import pytest

from engine.backbone.accounts import token_digest
from engine.backbone.rate_limits import LimitsConfig
from engine.backbone.store.account_records import TOKEN_IDLE
from engine.wire import WIRE_VERSION
from tests.collab.harness import running_backbone, start_peer, stop_all, tiny_project

pytestmark = pytest.mark.slow


@pytest.fixture
async def backbone(tmp_path, database):
    """On each engine: an SQLite file in ``tmp_path``, then a PostgreSQL database."""
    projects = (tiny_project(), tiny_project(id="private-lm", require_account=True))
    url = database if isinstance(database, str) else None
    async with running_backbone(tmp_path, *projects, database=url) as bb, aiohttp.ClientSession() as http:
        bb.http = http
        yield bb


async def call(bb, method, path, body=None, token=None, status=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with bb.http.request(method, bb.url + path, json=body, headers=headers) as resp:
        data = await resp.json()
        if status is not None:
            assert resp.status == status, data
        return resp.status, data


async def create(bb, username, password, status=201):
    body = {"username": username, "password": password}
    return await call(bb, "POST", "/api/accounts", body, status=status)


async def log_in(bb, username, password, status=200):
    body = {"username": username, "password": password}
    return await call(bb, "POST", "/api/sessions", body, status=status)


async def test_register_log_in_use_and_log_out(backbone):
    _, made = await create(backbone, "alice", "correct horse", status=201)
    assert made["username"] == "alice" and len(made["token"]) >= 43
    _, again = await log_in(backbone, "ALICE", "correct horse", status=200)
    assert again["token"] != made["token"]
    _, me = await call(backbone, "GET", "/api/me", token=again["token"], status=200)
    assert me["username"] == "alice" and me["projects"] == []
    await call(backbone, "DELETE", "/api/sessions", token=again["token"], status=200)
    _, refused = await call(backbone, "GET", "/api/me", token=again["token"], status=401)
    assert "not valid" in refused["error"]
    await call(backbone, "GET", "/api/me", token=made["token"], status=200)  # other sessions live on


async def test_taken_names_wrong_passwords_and_missing_tokens_are_refused_clearly(backbone):
    await create(backbone, "bob", "password1", status=201)
    _, taken = await create(backbone, "Bob", "password2", status=409)
    assert "taken" in taken["error"]
    _, wrong = await log_in(backbone, "bob", "nope-nope", status=401)
    assert wrong["error"] == "wrong username or password"
    _, nobody = await log_in(backbone, "nobody", "whatever1", status=401)
    assert nobody["error"] == wrong["error"]  # no hint whether the account exists
    _, missing = await call(backbone, "GET", "/api/me", status=401)
    assert "log in first" in missing["error"]
    _, short = await create(backbone, "x", "short", status=400)
    assert "username" in short["error"]


async def test_a_wrong_login_of_any_length_is_401_never_a_registration_rule(backbone):
    """Raising the registration minimums later must not lock an existing account out, or
    tell an attacker about the policy: logging in only ever says the pair is wrong."""
    await create(backbone, "carol", "password1", status=201)
    for username, password in (("carol", "x"), ("carol", ""), ("carol", "p" * 5000), ("c", "password1"),
                               ("carol with spaces", "password1"), ("é" * 300, "password1")):
        _, refused = await log_in(backbone, username, password, status=401)
        assert refused["error"] == "wrong username or password", (username[:20], password[:20])


async def test_repeated_failed_logins_are_slowed_down(backbone):
    await create(backbone, "carol", "password1", status=201)
    statuses = [(await call(backbone, "POST", "/api/sessions",
                            {"username": "carol", "password": f"guess-{i:04d}"}))[0] for i in range(7)]
    assert statuses[:5] == [401] * 5 and statuses[5:] == [429, 429]
    async with backbone.http.post(backbone.url + "/api/sessions",
                                  json={"username": "carol", "password": "password1"}) as resp:
        assert resp.status == 429 and int(resp.headers["Retry-After"]) > 0


async def test_one_address_guessing_many_accounts_is_slowed_down(backbone):
    """Every log-in from one address counts, right or wrong: a few at once, then one every 2 s
    (each guess a password hash meanwhile: the slower the machine hashes, the more refills
    the 32 guesses span, so the bound is taken from the time they took)."""
    rate = LimitsConfig().logins_per_address
    began = time.monotonic()
    statuses = [(await log_in(backbone, f"user{i:02d}", "guess-guess", status=None))[0] for i in range(32)]
    refills = (time.monotonic() - began) * rate.per_second
    assert statuses[: int(rate.burst)] == [401] * int(rate.burst)
    assert statuses.count(401) <= rate.burst + refills + 1 and statuses[-10:] == [429] * 10


def stored_bytes(bb, folder) -> bytes:
    """All the backbone keeps: its SQLite files, or every row of every table on PostgreSQL."""
    if bb.config.database is None:
        bb.store.database.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return b"".join(f.read_bytes() for f in folder.glob("backbone.sqlite3*"))
    db = bb.store.database
    tables = db.execute("SELECT table_name FROM information_schema.tables "
                        "WHERE table_schema='public'").fetchall()
    return b"".join(repr(db.execute(f"SELECT * FROM {name}").fetchall()).encode() for (name,) in tables)


async def test_passwords_and_tokens_are_never_stored_in_the_clear(backbone, tmp_path):
    password = "a fairly unusual passphrase"
    _, made = await create(backbone, "dora", password, status=201)
    _, again = await log_in(backbone, "dora", password, status=200)
    stored = stored_bytes(backbone, tmp_path)
    assert b"dora" in stored  # the records are the right ones
    for secret in (password, made["token"], again["token"]):
        assert secret.encode() not in stored


async def test_a_log_in_unused_for_ninety_days_expires_and_each_use_extends_it(backbone):
    _, made = await create(backbone, "erin", "pass-word-1", status=201)
    _, kept = await log_in(backbone, "erin", "pass-word-1", status=200)
    db = backbone.store.database
    db.execute("UPDATE tokens SET last_used = last_used - ? WHERE token_sha256 = ?",
               (TOKEN_IDLE + 60, token_digest(made["token"])))
    db.execute("UPDATE tokens SET last_used = last_used - ? WHERE token_sha256 = ?",
               (TOKEN_IDLE - 3600, token_digest(kept["token"])))
    _, expired = await call(backbone, "GET", "/api/me", token=made["token"], status=401)
    assert "not valid" in expired["error"]
    await call(backbone, "GET", "/api/me", token=kept["token"], status=200)  # used: 90 more days
    _, listed = await call(backbone, "GET", "/api/sessions", token=kept["token"], status=200)
    (session,) = listed["sessions"]  # the expired one is no longer listed
    assert session["expires"] - session["last_used"] == TOKEN_IDLE
    assert session["expires"] > time.time() + TOKEN_IDLE - 60


async def test_the_database_and_the_data_directory_are_the_owners_alone(tmp_path):
    """Password hashes, token digests and checkpoints: no other user of the machine reads them."""
    data = tmp_path / "data"
    async with running_backbone(data, tiny_project()) as bb, aiohttp.ClientSession() as http:
        bb.http = http
        await create(bb, "frank", "pass-word-1", status=201)
        files = [p for p in data.rglob("*")] + [data]
        assert any(p.name == "backbone.sqlite3" for p in files)
        loose = {str(p.relative_to(tmp_path)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
                 if stat.S_IMODE(p.stat().st_mode) & 0o077}
        assert loose == {}


async def test_projects_without_anonymous_peers_need_a_valid_token(backbone):
    join = {"wire": WIRE_VERSION}
    _, refused = await call(backbone, "POST", "/api/projects/private-lm/peers", join, status=401)
    assert "does not accept anonymous peers" in refused["error"]
    _, bad = await call(backbone, "POST", "/api/projects/private-lm/peers", join, token="forged", status=401)
    assert "not valid" in bad["error"]
    _, made = await create(backbone, "dave", "password1", status=201)
    _, joined = await call(backbone, "POST", "/api/projects/private-lm/peers", join, token=made["token"],
                           status=201)
    ws_url = f"{backbone.url}/api/projects/private-lm/peers/{joined['peer_id']}/ws"
    with pytest.raises(aiohttp.WSServerHandshakeError) as err:  # the peer token alone is not enough
        await backbone.http.ws_connect(ws_url, headers={"X-Cotrain-Peer-Token": joined["token"]})
    assert err.value.status == 401
    ws = await backbone.http.ws_connect(ws_url, headers={"X-Cotrain-Peer-Token": joined["token"],
                                                         "Authorization": f"Bearer {made['token']}"})
    await ws.close()


async def test_tokens_never_appear_in_logs(backbone, caplog):
    caplog.set_level(logging.DEBUG)
    _, made = await create(backbone, "erin", "password1", status=201)
    _, login = await log_in(backbone, "erin", "password1", status=200)
    await call(backbone, "GET", "/api/me", token="forged-token-value", status=401)
    peer = start_peer(backbone.url, "private-lm", "erins-peer", user_token=login["token"], max_epochs=2)
    try:
        assert await peer.finish(timeout=60) == "reached epoch 2"
    finally:
        await stop_all(peer)
    peer_token = peer.peer.client.join_reply.token
    await call(backbone, "DELETE", "/api/sessions", token=login["token"], status=200)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "erins-peer" in logged  # the logs did capture the session
    for secret in (made["token"], login["token"], peer_token, "forged-token-value", "password1"):
        assert secret not in logged
