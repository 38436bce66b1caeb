"""kill -9 of the backbone during a run: the ledger survives, peers reconnect, nothing counts twice."""

import asyncio
import os
import signal
import socket
import sqlite3
import sys

import pytest

from engine.paths import engine_command
from engine.peer.events import Connection
from tests.collab.accounts import register
from tests.collab.harness import start_peer, stop_all, tiny_project
from tests.collab.processes import write_catalog
from tests.conftest import until

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_backbone(port: int, data_dir, catalog) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        *engine_command(), "backbone", "--port", str(port), "--data-dir", str(data_dir),
        "--catalog", str(catalog), stdout=asyncio.subprocess.PIPE, stderr=sys.stderr,
    )
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert line.decode().startswith("backbone listening on http://127.0.0.1:"), line
    return process


def ledger(db_path) -> tuple[dict[str, int], int, int]:
    """(credited samples per user, samples of all recorded steps, contribution rows)."""
    with sqlite3.connect(db_path) as db:
        users = dict(db.execute("SELECT users.username, t.samples FROM user_totals t "
                                "JOIN users ON users.id = t.user_id"))
        steps = db.execute("SELECT COALESCE(SUM(samples), 0) FROM steps").fetchone()[0]
        rows = db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0]
    return users, steps, rows


async def test_killing_the_backbone_loses_no_credit_and_counts_nothing_twice(tmp_path):
    project = tiny_project(allow_anonymous=False, target_batch_size=96, round_timeout=10)
    catalog = write_catalog(tmp_path / "catalog.json", project)
    port, data = _free_port(), tmp_path / "backbone"
    url = f"http://127.0.0.1:{port}"
    backbone = await start_backbone(port, data, catalog)
    peers = []
    try:
        tokens = {user: await register(url, user) for user in ("alice", "bob")}
        peers = [start_peer(url, project.id, name, user_token=tokens[user])
                 for name, user in (("alice-1", "alice"), ("alice-2", "alice"), ("bob-1", "bob"))]
        for p in peers:
            await p.reached(4, timeout=120)
        backbone.send_signal(signal.SIGKILL)
        await backbone.wait()
        before, steps_before, _ = ledger(data / "backbone.sqlite3")
        assert sum(before.values()) == steps_before > 0  # consistent at the moment of the crash
        await until(lambda: all(any(isinstance(e, Connection) and not e.connected for e in p.events)
                                for p in peers), 30, "peers to notice the backbone is gone")
        epoch_at_crash = max(p.history[-1].epoch for p in peers)

        backbone = await start_backbone(port, data, catalog)
        for p in peers:
            await p.reached(epoch_at_crash + 3, timeout=120)
        assert all(any(isinstance(e, Connection) and e.connected for e in p.events) for p in peers)
    finally:
        await stop_all(*peers)
        if backbone.returncode is None:
            backbone.send_signal(signal.SIGTERM)
            await asyncio.wait_for(backbone.wait(), 30)
    after, steps_after, rows = ledger(data / "backbone.sqlite3")
    assert all(after[user] >= before[user] for user in before)
    assert sum(after.values()) == steps_after > steps_before
    with sqlite3.connect(data / "backbone.sqlite3") as db:
        distinct = db.execute("SELECT COUNT(DISTINCT round_id || peer_id) FROM contributions").fetchone()[0]
    assert distinct == rows
    assert os.path.exists(data / "backbone.sqlite3")
