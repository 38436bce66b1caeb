"""kill -9 of the backbone during a run: the ledger survives, peers reconnect, nothing counts
twice -- on an SQLite file and on a PostgreSQL server."""

import asyncio
import contextlib
import signal
import socket
import sys
from contextlib import closing

import pytest

from engine.backbone.store.opening import open_database
from engine.paths import engine_command
from engine.peer.events import Connection, RoundFailed
from tests.collab.accounts import register
from tests.collab.harness import start_peer, stop_all, tiny_project
from tests.collab.processes import write_catalog
from tests.conftest import until

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_backbone(port: int, data_dir, catalog, database=None, log=None) -> asyncio.subprocess.Process:
    """(``log``: a file its log is added to, rather than the test's stderr.)"""
    on = ["--database", database] if isinstance(database, str) else []
    with open(log, "ab") if log is not None else contextlib.nullcontext(sys.stderr) as err:
        process = await asyncio.create_subprocess_exec(
            *engine_command(), "backbone", "-v", "--port", str(port), "--data-dir", str(data_dir),
            "--catalog", str(catalog), *on, stdout=asyncio.subprocess.PIPE, stderr=err,
        )
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    assert line.decode().startswith("backbone listening on http://127.0.0.1:"), line
    return process


def ledger(db_path) -> tuple[dict[str, int], int, int]:
    """(credited samples per user, samples of all recorded steps, contribution rows)."""
    with closing(open_database(db_path)) as db:
        users = dict(db.execute("SELECT users.username, t.samples FROM user_totals t "
                                "JOIN users ON users.id = t.user_id").fetchall())
        steps = db.execute("SELECT CAST(COALESCE(SUM(samples), 0) AS BIGINT) FROM steps").fetchone()[0]
        rows = db.execute("SELECT COUNT(*) FROM contributions").fetchone()[0]
    return users, steps, rows


def recorded_steps(db_path) -> list[tuple[int, int, int, int]]:
    """(epoch, round id, samples, credited samples) of every recorded step, by epoch."""
    with closing(open_database(db_path)) as db:
        return db.execute(
            "SELECT s.epoch, s.round_id, s.samples, CAST(COALESCE(SUM(c.samples), 0) AS BIGINT) FROM steps s "
            "LEFT JOIN contributions c ON c.project = s.project AND c.round_id = s.round_id "
            "GROUP BY s.project, s.round_id ORDER BY s.epoch").fetchall()


async def crash(backbone, peers) -> None:
    backbone.send_signal(signal.SIGKILL)
    await backbone.wait()
    await until(lambda: all(any(isinstance(e, Connection) and not e.connected for e in p.events[-50:])
                            for p in peers), 30, "peers to notice the backbone is gone")


async def test_killing_the_backbone_loses_no_credit_and_counts_nothing_twice(tmp_path, database):
    project = tiny_project(require_account=True, target_batch_size=96, round_timeout=10)
    catalog = write_catalog(tmp_path / "catalog.json", project)
    port, data = _free_port(), tmp_path / "backbone"
    url = f"http://127.0.0.1:{port}"
    db_path = database if isinstance(database, str) else data / "backbone.sqlite3"
    backbone = await start_backbone(port, data, catalog, database)
    peers = []
    try:
        tokens = {user: await register(url, user) for user in ("alice", "bob")}
        peers = [start_peer(url, project.id, name, user_token=tokens[user])
                 for name, user in (("alice-1", "alice"), ("alice-2", "alice"), ("bob-1", "bob"))]
        for p in peers:
            await p.reached(4, timeout=120)
        # In the middle of a round: the peers finish it among themselves, and the backbone
        # never hears of that step.
        await until(lambda: any(p.peer.optimizer.in_round for p in peers), 30, "a round to open")
        await crash(backbone, peers)
        before, steps_before, _ = ledger(db_path)
        assert sum(before.values()) == steps_before > 0  # consistent at the moment of the crash
        epoch_at_crash = max(p.history[-1].step.epoch for p in peers)

        backbone = await start_backbone(port, data, catalog, database)
        for p in peers:
            await p.reached(epoch_at_crash + 1, timeout=120)
        # Again the moment a step completes: it may be done on the peers and not yet recorded.
        await crash(backbone, peers)
        epoch_at_crash = max(p.history[-1].step.epoch for p in peers)
        down = [len(p.events) for p in peers]
        backbone = await start_backbone(port, data, catalog, database)

        def reconnected(p, since):
            return next((i for i, e in enumerate(p.events[since:], since)
                         if isinstance(e, Connection) and e.connected), None)

        await until(lambda: all(reconnected(p, n) is not None for p, n in zip(peers, down, strict=True)),
                    60, "peers to reconnect")
        back = [reconnected(p, n) for p, n in zip(peers, down, strict=True)]
        for p in peers:
            await p.reached(epoch_at_crash + 3, timeout=120)
        assert all(any(isinstance(e, Connection) and e.connected for e in p.events) for p in peers)
        # Once back, rounds just work: no round id a previous run handed out is reused.
        assert not [e for p, n in zip(peers, back, strict=True) for e in p.events[n:]
                    if isinstance(e, RoundFailed)]
    finally:
        await stop_all(*peers)
        if backbone.returncode is None:
            backbone.send_signal(signal.SIGTERM)
            await asyncio.wait_for(backbone.wait(), 30)
    after, _, _ = ledger(db_path)
    assert all(after[user] >= before[user] for user in before)
    steps = recorded_steps(db_path)
    epochs = [epoch for epoch, *_ in steps]
    assert epochs == list(range(1, epochs[-1] + 1)), "an epoch recorded twice, or lost"
    assert [rid for _, rid, *_ in steps] == sorted({rid for _, rid, *_ in steps})
    # Each step's credits add up to its samples, except a step the peers finished while
    # the backbone was down: recorded from their report, credited to nobody (at most one
    # per crash). The users' totals are exactly the credited steps' samples.
    assert not [s for s in steps if s[3] not in (s[2], 0)], steps
    assert sum(credited == 0 for *_, credited in steps) <= 2
    assert sum(after.values()) == sum(credited for *_, credited in steps) > steps_before
