"""The backbone's durable state in one SQLite file, readable by its owner only.

WAL mode with synchronous=NORMAL: a killed process loses no committed transaction.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from engine.backbone.store.database import Conflict, Params
from engine.backbone.store.schema import SCHEMA_VERSION, SQLITE

log = logging.getLogger(__name__)


class SqliteDatabase:
    dialect = SQLITE

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not path.exists() or path.stat().st_size == 0
        old_umask = os.umask(0o077)  # the database and its WAL files: the owner's alone
        try:
            self.connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.connection.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(old_umask)
        for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if name.exists():
                name.chmod(0o600)
        self.connection.execute("PRAGMA synchronous=NORMAL")
        self.connection.execute("PRAGMA foreign_keys=ON")
        version = SCHEMA_VERSION
        if not fresh:
            version = int(self.connection.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{path} was written by a newer Cotrain (schema {version})")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                self._migrate(path, target)
        self.connection.executescript(self.dialect.schema)  # what a newer schema adds
        self.connection.execute("INSERT INTO meta VALUES ('schema', ?) ON CONFLICT DO NOTHING",
                                (str(SCHEMA_VERSION),))
        self.migrated_hashes = version < 2

    def _migrate(self, path: Path, target: int) -> None:
        log.info("%s: migrating to schema %d", path, target)
        # All of a migration or none of it: a crash midway must not leave a schema that is
        # neither the old nor the new one.
        try:
            done = f"UPDATE meta SET value='{target}' WHERE key='schema'; COMMIT;"
            self.connection.executescript(f"BEGIN IMMEDIATE; {self.dialect.migrations[target]}{done}")
        except sqlite3.Error:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            self.connection.close()
            raise

    def execute(self, sql: str, params: Params = ()) -> sqlite3.Cursor:
        try:
            return self.connection.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            raise Conflict(str(exc)) from exc

    def executemany(self, sql: str, params: Sequence[Params]) -> None:
        self.connection.executemany(sql, params)

    @contextmanager
    def transaction(self) -> Iterator[SqliteDatabase]:
        """All of it or none of it (a failed COMMIT rolls back too)."""
        self.connection.execute("BEGIN IMMEDIATE")
        try:
            yield self
            self.connection.execute("COMMIT")
        except BaseException:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.connection.close()
