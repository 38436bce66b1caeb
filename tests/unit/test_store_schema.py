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
