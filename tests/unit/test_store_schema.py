"""The backbone's SQLite file across versions: a migration applies whole or not at all."""

import sqlite3

import pytest

from engine.backbone.store import schema as store_module
from engine.backbone.store.repositories import Store
from engine.backbone.store.schema import SCHEMA_VERSION

SCHEMA_5 = (("contributions", "withdrawn_at"), ("contributions", "withdrawn_why"),
            ("user_totals", "withdrawn_samples"), ("user_totals", "withdrawn_bytes"))


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
    from engine.wire.rest import Ranking
    from engine.wire.types import PeerRole

    path = tmp_path / "backbone.sqlite3"
    store = Store(path)
    alice = store.accounts.create_user("alice", b"s", b"h")
    store.rounds.set_collaboration("p", 3, None)
    store.peers.add("old", "p", "old", "t" * 64, alice.id)
    store.credit.record_credits("p", 1, {"old": Credit(120, 4.0)}, {"old": alice.id})
    store.close()
    with sqlite3.connect(path) as db:  # back to how schema 2 left the file
        db.execute("DROP INDEX leaderboard_aggregated")
        for table, column in (("peers", "role"), ("contributions", "aggregated_bytes"),
                              ("user_totals", "aggregated_bytes"), ("collaborations", "aggregated_bytes"),
                              ("users", "kdf"), *SCHEMA_5):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("UPDATE meta SET value='2' WHERE key='schema'")

    store = Store(path)
    assert store.peers.known("old", "p").role is PeerRole.TRAINER
    bob = store.accounts.create_user("bob", b"s", b"h")
    store.peers.add("helper", "p", "helper", "t" * 64, bob.id, PeerRole.AUXILIARY)
    store.credit.record_credits("p", 2, {"helper": Credit(0, 0.0, 5_000_000)}, {"helper": bob.id})
    (totals, aggregated), rows = store.credit.leaderboard("p", 10, 0)
    assert (totals, aggregated) == (120, 5_000_000)
    assert [(r[0], r[2], r[5]) for r in rows] == [("alice", 120, 0), ("bob", 0, 5_000_000)]
    _, by_bytes = store.credit.leaderboard("p", 10, 0, Ranking.AGGREGATED)
    assert [r[0] for r in by_bytes] == ["bob"]  # only who aggregated anything
    assert store.credit.rank("p", bob.id, Ranking.AGGREGATED) == 1
    assert store.credit.rank("p", alice.id, Ranking.AGGREGATED) is None
    assert store.peers.known("helper", "p").role is PeerRole.AUXILIARY
    assert schema_of(path)[0] == SCHEMA_VERSION
    store.close()


def test_a_schema_3_file_marks_its_password_hashes_as_made_with_the_old_parameters(tmp_path):
    """Hashes stored before each said what made it were scrypt n=2^14: a log-in checks them so
    (and hashes the password anew, api_accounts.login); new ones say n=2^17."""
    from engine.backbone.accounts import LEGACY_HASH, PASSWORD_HASH, hash_password, password_matches

    path = tmp_path / "backbone.sqlite3"
    Store(path).close()
    salt, digest = hash_password("old password", params=LEGACY_HASH)
    with sqlite3.connect(path) as db:  # back to how schema 3 left the file, with one old account
        for table, column in (("users", "kdf"), *SCHEMA_5):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        db.execute("INSERT INTO users (username, salt, password_hash, created_at) VALUES ('old',?,?,0)",
                   (salt, digest))
        db.execute("UPDATE meta SET value='3' WHERE key='schema'")
    store = Store(path)
    old = store.accounts.user_secret("old")
    assert old is not None and old.kdf == LEGACY_HASH.text
    assert password_matches("old password", old.salt, old.password_hash, LEGACY_HASH)
    salt, digest = hash_password("old password")
    store.accounts.set_password(old.user.id, salt, digest, PASSWORD_HASH.text)
    store.accounts.create_user("new", b"s", b"h")
    assert {name: store.accounts.user_secret(name).kdf for name in ("old", "new")} == \
        {"old": PASSWORD_HASH.text, "new": PASSWORD_HASH.text}
    assert schema_of(path)[0] == SCHEMA_VERSION
    store.close()


def test_peers_that_never_connected_or_left_long_ago_are_forgotten_and_their_credit_stays(database):
    """Joins are cheap: their rows must not stay for ever. A peer still connected, one that
    joined a moment ago or left today is kept; credit and online time do not need the rows."""
    from engine.backbone.ledger import Credit
    from engine.backbone.store.peer_records import LEFT_KEPT, NEVER_CONNECTED_KEPT

    store = Store(database)
    alice = store.accounts.create_user("alice", b"s", b"h")
    store.rounds.set_collaboration("p", 0, None)
    for peer in ("stale-join", "fresh-join", "connected", "left-today", "left-long-ago"):
        store.peers.add(peer, "p", peer, "t" * 64, alice.id)
    now = 10 * LEFT_KEPT
    store.database.execute("UPDATE peers SET joined_at=?", (now - 2 * LEFT_KEPT,))
    store.database.execute("UPDATE peers SET joined_at=? WHERE peer_id='fresh-join'",
                           (now - NEVER_CONNECTED_KEPT / 2,))
    for peer in ("connected", "left-today", "left-long-ago"):
        store.peers.connected(peer, at=now - 2 * LEFT_KEPT)
    store.peers.left("left-today", at=now - LEFT_KEPT / 2)
    store.peers.left("left-long-ago", at=now - LEFT_KEPT - 1)
    store.credit.record_credits("p", 1, {"left-long-ago": Credit(120, 4.0)}, {"left-long-ago": alice.id})

    assert store.peers.prune(now) == 2
    kept = {row[0] for row in store.database.execute("SELECT peer_id FROM peers").fetchall()}
    assert kept == {"fresh-join", "connected", "left-today"}
    assert store.credit.credited_by_peer("p") == {"left-long-ago": 120}
    assert store.credit.credited_by_user("p") == {"alice": 120}
    assert store.credit.user_totals(alice.id)[0].online_seconds > 0
    store.close()
