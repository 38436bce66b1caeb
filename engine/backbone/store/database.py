"""The backbone's durable state in one SQLite file, readable by its owner only: its
schema, its migrations, and the one connection every repository (engine/backbone/store/)
works through.

WAL mode with synchronous=NORMAL: a killed process loses no committed transaction.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.backbone.accounts import LEGACY_HASH

log = logging.getLogger(__name__)
SCHEMA_VERSION = 5
# Version 2: hashes cover the whole state (parameters, optimizer state, epoch), not the
# parameters alone, so the old ones name nothing a peer holds any more; log-in tokens
# expire unused and say what client made them. Version 3: auxiliary peers, credited with
# the bytes they aggregated. Version 4: each password hash says what parameters made it
# (those stored before were scrypt n=2^14), so it can be hashed anew at the next log-in.
# Version 5: credit withdrawn from a reducer caught lying (store/credit.py).
MIGRATIONS = {
    2: """
ALTER TABLE tokens ADD COLUMN last_used REAL;
ALTER TABLE tokens ADD COLUMN client TEXT NOT NULL DEFAULT '';
ALTER TABLE collaborations RENAME COLUMN params_sha256 TO state_sha256;
ALTER TABLE steps RENAME COLUMN params_sha256 TO state_sha256;
ALTER TABLE checkpoints RENAME COLUMN params_sha256 TO state_sha256;
UPDATE collaborations SET state_sha256 = NULL;
""",
    3: """
ALTER TABLE peers ADD COLUMN role TEXT NOT NULL DEFAULT 'trainer';
ALTER TABLE contributions ADD COLUMN aggregated_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE user_totals ADD COLUMN aggregated_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE collaborations ADD COLUMN aggregated_bytes INTEGER NOT NULL DEFAULT 0;
""",
    4: f"""
ALTER TABLE users ADD COLUMN kdf TEXT NOT NULL DEFAULT '{LEGACY_HASH.text}';
""",
    5: """
ALTER TABLE contributions ADD COLUMN withdrawn_at REAL;
ALTER TABLE contributions ADD COLUMN withdrawn_why TEXT;
ALTER TABLE user_totals ADD COLUMN withdrawn_samples INTEGER NOT NULL DEFAULT 0;
ALTER TABLE user_totals ADD COLUMN withdrawn_bytes INTEGER NOT NULL DEFAULT 0;
""",
}
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    id INTEGER PRIMARY KEY, username TEXT NOT NULL UNIQUE COLLATE NOCASE,
    salt BLOB NOT NULL, password_hash BLOB NOT NULL, created_at REAL NOT NULL,
    kdf TEXT NOT NULL DEFAULT '{LEGACY_HASH.text}'
);
CREATE TABLE IF NOT EXISTS tokens (
    token_sha256 TEXT PRIMARY KEY, user_id INTEGER NOT NULL REFERENCES users(id),
    created_at REAL NOT NULL, revoked_at REAL, last_used REAL, client TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS collaborations (
    project TEXT PRIMARY KEY, epoch INTEGER NOT NULL, state_sha256 TEXT,
    credited_samples INTEGER NOT NULL DEFAULT 0, aggregated_bytes INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS steps (
    project TEXT NOT NULL, round_id INTEGER NOT NULL, epoch INTEGER NOT NULL, loss REAL,
    samples INTEGER NOT NULL, peers INTEGER NOT NULL, round_seconds REAL NOT NULL,
    state_sha256 TEXT NOT NULL, finished_at REAL NOT NULL, PRIMARY KEY (project, round_id)
);
CREATE INDEX IF NOT EXISTS steps_by_epoch ON steps (project, epoch);
CREATE TABLE IF NOT EXISTS contributions (
    project TEXT NOT NULL, round_id INTEGER NOT NULL, peer_id TEXT NOT NULL,
    user_id INTEGER REFERENCES users(id), samples INTEGER NOT NULL,
    compute_seconds REAL NOT NULL, credited_at REAL NOT NULL,
    aggregated_bytes INTEGER NOT NULL DEFAULT 0, withdrawn_at REAL, withdrawn_why TEXT,
    PRIMARY KEY (project, round_id, peer_id)
);
CREATE INDEX IF NOT EXISTS contributions_by_user ON contributions (user_id, credited_at);
CREATE TABLE IF NOT EXISTS user_totals (
    project TEXT NOT NULL, user_id INTEGER NOT NULL REFERENCES users(id),
    samples INTEGER NOT NULL DEFAULT 0, compute_seconds REAL NOT NULL DEFAULT 0,
    online_seconds REAL NOT NULL DEFAULT 0, last_seen REAL NOT NULL DEFAULT 0,
    aggregated_bytes INTEGER NOT NULL DEFAULT 0, withdrawn_samples INTEGER NOT NULL DEFAULT 0,
    withdrawn_bytes INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (project, user_id)
);
CREATE INDEX IF NOT EXISTS leaderboard ON user_totals (project, samples DESC, user_id);
CREATE INDEX IF NOT EXISTS leaderboard_aggregated ON user_totals (project, aggregated_bytes DESC, user_id);
CREATE TABLE IF NOT EXISTS sessions (
    project TEXT NOT NULL, user_id INTEGER NOT NULL REFERENCES users(id), peer_id TEXT NOT NULL,
    started REAL NOT NULL, ended REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_user ON sessions (project, user_id, ended);
CREATE TABLE IF NOT EXISTS checkpoints (
    project TEXT NOT NULL, epoch INTEGER NOT NULL, sha256 TEXT NOT NULL,
    state_sha256 TEXT NOT NULL, size INTEGER NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (project, epoch)
);
CREATE TABLE IF NOT EXISTS rounds (
    project TEXT PRIMARY KEY, round_id INTEGER NOT NULL, epoch INTEGER NOT NULL,
    members TEXT NOT NULL, opened_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS peers (
    peer_id TEXT PRIMARY KEY, project TEXT NOT NULL, name TEXT NOT NULL,
    token_sha256 TEXT NOT NULL, user_id INTEGER REFERENCES users(id), joined_at REAL NOT NULL,
    connected_at REAL, last_seen REAL, left_at REAL, role TEXT NOT NULL DEFAULT 'trainer'
);
"""

CURVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS heldout (
    project TEXT NOT NULL, epoch INTEGER NOT NULL, loss REAL NOT NULL, accuracy REAL,
    scores INTEGER NOT NULL, scored_at REAL NOT NULL, PRIMARY KEY (project, epoch));
"""


class Database:
    """One SQLite file, opened (created or migrated to this schema) for the repositories."""

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
                log.info("%s: migrating to schema %d", path, target)
                # All of a migration or none of it: a crash midway must not leave a schema
                # that is neither the old nor the new one.
                try:
                    done = f"UPDATE meta SET value='{target}' WHERE key='schema'; COMMIT;"
                    self.connection.executescript(f"BEGIN IMMEDIATE; {MIGRATIONS[target]}{done}")
                except sqlite3.Error:
                    if self.connection.in_transaction:
                        self.connection.execute("ROLLBACK")
                    self.connection.close()
                    raise
        self.connection.executescript(SCHEMA + CURVE_SCHEMA)  # what a newer schema adds
        self.connection.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self.migrated_hashes = version < 2  # stored checkpoints' hashes are to be computed anew

    def close(self) -> None:
        self.connection.close()


class Repository:
    """What every repository shares: the database's connection, and transactions on it."""

    def __init__(self, database: Database) -> None:
        self.db = database.connection

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """All of it or none of it (a failed COMMIT rolls back too)."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
            self.db.execute("COMMIT")
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
