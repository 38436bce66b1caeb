"""The backbone's schema, written once for SQLite, and what differs in PostgreSQL's SQL
(a Dialect): the repositories' queries are the same on both but for these few fragments.

SQLite files older than SCHEMA_VERSION are migrated (MIGRATIONS); PostgreSQL stores began
at version 5, so its migrations start after it. A migration that only adds a table is empty:
the schema's CREATE TABLE IF NOT EXISTS adds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.backbone.accounts import LEGACY_HASH

SCHEMA_VERSION = 7
# Version 2: hashes cover the whole state (parameters, optimizer state, epoch), not the
# parameters alone, so the old ones name nothing a peer holds any more; log-in tokens
# expire unused and say what client made them. Version 3: auxiliary peers, credited with
# the bytes they aggregated. Version 4: each password hash says what parameters made it
# (those stored before were scrypt n=2^14), so it can be hashed anew at the next log-in.
# Version 5: credit withdrawn from a reducer caught lying (store/credit_records.py). Version 6:
# project leases, for several backbone processes on one database (store/lease_records.py). Version 7:
# the settings each project folder's state depends on, and its version (store/project_models.py).
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
    6: "",  # (the leases table is new: the schema below creates it)
    7: "",  # (so is project_models)
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
CREATE TABLE IF NOT EXISTS project_models (
    project TEXT PRIMARY KEY, settings TEXT NOT NULL, version_sha256 TEXT NOT NULL, since REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS leases (
    project TEXT PRIMARY KEY, holder TEXT NOT NULL, url TEXT NOT NULL, expires REAL NOT NULL,
    status TEXT NOT NULL DEFAULT ''
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


@dataclass(frozen=True)
class Dialect:
    """The SQL that differs between the two databases."""

    name: str
    schema: str
    token_id: str  # a log-in token's number, as the user's list of log-ins shows it
    username_is: str  # matches a username whatever its case
    migrations: dict[int, str]

    def greatest(self, a: str, b: str) -> str:
        return f"{'MAX' if self.name == 'sqlite' else 'GREATEST'}({a}, {b})"

    @property
    def now(self) -> str:
        """The database's clock in UNIX seconds: one clock for every process that shares it."""
        if self.name == "sqlite":
            return "((julianday('now') - 2440587.5) * 86400.0)"
        return "EXTRACT(EPOCH FROM clock_timestamp())"

    @property
    def locking(self) -> str:
        """What a SELECT adds to lock the rows it reads until the transaction ends (SQLite's
        transactions hold the whole database from BEGIN IMMEDIATE on)."""
        return "" if self.name == "sqlite" else " FOR UPDATE"

    def hour_of(self, seconds: str) -> str:
        """The start of the hour a time falls in (PostgreSQL's CAST rounds, SQLite's truncates)."""
        if self.name == "sqlite":
            return f"CAST({seconds} / 3600 AS INTEGER) * 3600"
        return f"CAST(FLOOR({seconds} / 3600) AS BIGINT) * 3600"


def _postgres_schema(sqlite: str) -> str:
    """SQLite's schema in PostgreSQL's types: 8-byte integers (sums outgrow 4) and floats
    (PostgreSQL's REAL has 4 bytes), BYTEA, an identity for ids and log-ins, and usernames
    unique whatever their case."""
    ddl = sqlite.replace("id INTEGER PRIMARY KEY,", "id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,")
    ddl = ddl.replace(" COLLATE NOCASE", "")
    ddl = ddl.replace("token_sha256 TEXT PRIMARY KEY,",
                      "token_sha256 TEXT PRIMARY KEY, id BIGINT GENERATED BY DEFAULT AS IDENTITY UNIQUE,")
    types = (("INTEGER", "BIGINT"), ("REAL", "DOUBLE PRECISION"), ("BLOB", "BYTEA"))
    for sqlite_type, postgres_type in types:
        ddl = re.sub(rf"\b{sqlite_type}\b", postgres_type, ddl)
    return ddl + "CREATE UNIQUE INDEX IF NOT EXISTS users_by_name ON users (lower(username));\n"


SQLITE = Dialect("sqlite", SCHEMA + CURVE_SCHEMA, token_id="rowid", username_is="username=?",
                 migrations=MIGRATIONS)
POSTGRES = Dialect("postgresql", _postgres_schema(SCHEMA + CURVE_SCHEMA), token_id="id",
                   username_is="lower(username)=lower(?)", migrations={6: "", 7: ""})
