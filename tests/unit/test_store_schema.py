"""The backbone's SQLite file across versions: a migration applies whole or not at all."""

import sqlite3

import pytest

from engine.backbone import store as store_module
from engine.backbone.store import SCHEMA_VERSION, Store


def schema_of(path):
    with sqlite3.connect(path) as db:
        version = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0]
        columns = {row[1] for row in db.execute("PRAGMA table_info(tokens)")}
    return int(version), columns


def test_a_migration_that_fails_midway_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / "backbone.sqlite3"
    Store(path).close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION - 1),))
    broken = "ALTER TABLE tokens ADD COLUMN probe REAL; INSERT INTO no_such_table VALUES (1);"
    monkeypatch.setitem(store_module.MIGRATIONS, SCHEMA_VERSION, broken)
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        Store(path)
    version, columns = schema_of(path)
    assert version == SCHEMA_VERSION - 1 and "probe" not in columns


def test_an_empty_file_is_a_fresh_database(tmp_path):
    path = tmp_path / "backbone.sqlite3"
    path.touch()
    store = Store(path)
    store.close()
    assert schema_of(path)[0] == SCHEMA_VERSION


def test_a_schema_2_ledger_keeps_its_totals_and_gains_auxiliary_credit(tmp_path):
    """A backbone upgraded from before auxiliary peers: users' samples stay as they were,
    every known peer is a trainer, and bytes aggregated from then on count apart."""
    from engine.backbone.ledger import Credit
    from engine.wire.api import Ranking
    from engine.wire.types import PeerRole

    path = tmp_path / "backbone.sqlite3"
    store = Store(path)
    alice = store.create_user("alice", b"s", b"h")
    store.set_collaboration("p", 3, None)
    store.add_peer("old", "p", "old", "t" * 64, alice.id)
    store.record_credits("p", 1, {"old": Credit(120, 4.0)}, {"old": alice.id})
    store.close()
    with sqlite3.connect(path) as db:  # back to how schema 2 left the file
        db.execute("DROP INDEX leaderboard_aggregated")
        for table, column in (("peers", "role"), ("contributions", "aggregated_bytes"),
                              ("user_totals", "aggregated_bytes"), ("collaborations", "aggregated_bytes")):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("UPDATE meta SET value='2' WHERE key='schema'")

    store = Store(path)
    assert store.peer("old", "p").role is PeerRole.TRAINER
    bob = store.create_user("bob", b"s", b"h")
    store.add_peer("helper", "p", "helper", "t" * 64, bob.id, PeerRole.AUXILIARY)
    store.record_credits("p", 2, {"helper": Credit(0, 0.0, 5_000_000)}, {"helper": bob.id})
    (totals, aggregated), rows = store.leaderboard("p", 10, 0)
    assert (totals, aggregated) == (120, 5_000_000)
    assert [(r[0], r[2], r[5]) for r in rows] == [("alice", 120, 0), ("bob", 0, 5_000_000)]
    _, by_bytes = store.leaderboard("p", 10, 0, Ranking.AGGREGATED)
    assert [r[0] for r in by_bytes] == ["bob"]  # only who aggregated anything
    assert store.rank("p", bob.id, Ranking.AGGREGATED) == 1
    assert store.rank("p", alice.id, Ranking.AGGREGATED) is None
    assert store.peer("helper", "p").role is PeerRole.AUXILIARY
    assert schema_of(path)[0] == SCHEMA_VERSION == 3
    store.close()
