"""The backbone's durable state in one SQLite file, readable by its owner only.

WAL mode with synchronous=NORMAL: a killed process loses no committed transaction. A
settled step and the collaboration's new epoch are one transaction; a round's credits and
the users' totals another, keyed by (project, round, peer), so a restart can neither lose
nor repeat one. The last round each project opened is kept, to settle it after a restart.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from engine.backbone.accounts import LEGACY_HASH, PASSWORD_HASH
from engine.backbone.store_curve import CURVE_SCHEMA, CurveTables
from engine.backbone.store_ledger import LedgerTables
from engine.backbone.tracker.outputs import RoundOpened
from engine.wire.control import CheckpointInfo, Step
from engine.wire.rest import LoginSession
from engine.wire.types import PeerRole

log = logging.getLogger(__name__)
TOKEN_IDLE = 90 * 86400.0  # a log-in unused this long expires
TOKEN_TOUCH = 3600.0  # how stale a token's last use may be recorded
SCHEMA_VERSION = 5
# Version 2: hashes cover the whole state (parameters, optimizer state, epoch), not the
# parameters alone, so the old ones name nothing a peer holds any more; log-in tokens
# expire unused and say what client made them. Version 3: auxiliary peers, credited with
# the bytes they aggregated. Version 4: each password hash says what parameters made it
# (those stored before were scrypt n=2^14), so it can be hashed anew at the next log-in.
# Version 5: credit withdrawn from a reducer caught lying (store_ledger.py).
NEVER_CONNECTED_KEPT = 3600.0  # a peer that joined and never opened its socket, forgotten after
LEFT_KEPT = 86400.0  # a peer gone this long is forgotten (it joins anew); its credit stays
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


@dataclass
class User:
    id: int
    username: str


@dataclass(frozen=True)
class KnownPeer:
    name: str
    token_sha256: str
    user_id: int | None
    role: PeerRole


@dataclass(frozen=True)
class Secret:
    """What a log-in is checked against: the password's salt, hash and hash parameters."""

    user: User
    salt: bytes
    password_hash: bytes
    kdf: str


class UsernameTaken(ValueError):
    pass


class Store(LedgerTables, CurveTables):
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not path.exists() or path.stat().st_size == 0
        old_umask = os.umask(0o077)  # the database and its WAL files: the owner's alone
        try:
            self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(old_umask)
        for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if name.exists():
                name.chmod(0o600)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        version = SCHEMA_VERSION
        if not fresh:
            version = int(self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise RuntimeError(f"{path} was written by a newer Cotrain (schema {version})")
            for target in range(version + 1, SCHEMA_VERSION + 1):
                log.info("%s: migrating to schema %d", path, target)
                # All of a migration or none of it: a crash midway must not leave a schema
                # that is neither the old nor the new one.
                try:
                    self.db.executescript(f"BEGIN IMMEDIATE; {MIGRATIONS[target]}"
                                          f"UPDATE meta SET value='{target}' WHERE key='schema'; COMMIT;")
                except sqlite3.Error:
                    if self.db.in_transaction:
                        self.db.execute("ROLLBACK")
                    self.db.close()
                    raise
        self.db.executescript(SCHEMA + CURVE_SCHEMA)  # what a newer schema adds
        self.db.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self.migrated_hashes = version < 2  # stored checkpoints' hashes are to be computed anew

    def close(self) -> None:
        self.db.close()

    # --- accounts -------------------------------------------------------------------------

    def create_user(self, username: str, salt: bytes, password_hash: bytes,
                    kdf: str = PASSWORD_HASH.text) -> User:
        try:
            cur = self.db.execute(
                "INSERT INTO users (username, salt, password_hash, created_at, kdf) VALUES (?,?,?,?,?)",
                (username, salt, password_hash, time.time(), kdf),
            )
        except sqlite3.IntegrityError:
            raise UsernameTaken(username) from None
        assert cur.lastrowid is not None
        return User(cur.lastrowid, username)

    def user_secret(self, username: str) -> Secret | None:
        row = self.db.execute(
            "SELECT id, username, salt, password_hash, kdf FROM users WHERE username=?", (username,)
        ).fetchone()
        return Secret(User(row[0], row[1]), row[2], row[3], row[4]) if row else None

    def set_password(self, user_id: int, salt: bytes, password_hash: bytes, kdf: str) -> None:
        self.db.execute("UPDATE users SET salt=?, password_hash=?, kdf=? WHERE id=?",
                        (salt, password_hash, kdf, user_id))

    def add_token(self, user: User, token_sha256: str, client: str = "") -> None:
        now = time.time()
        self.db.execute("INSERT INTO tokens VALUES (?,?,?,NULL,?,?)",
                        (token_sha256, user.id, now, now, client))

    def user_for_token(self, token_sha256: str) -> User | None:
        """The token's user, if it is neither revoked nor unused for TOKEN_IDLE; each use
        pushes its expiry back (written at most once per TOKEN_TOUCH)."""
        now = time.time()
        row = self.db.execute(
            "SELECT users.id, users.username, COALESCE(tokens.last_used, tokens.created_at) FROM tokens "
            "JOIN users ON users.id = tokens.user_id WHERE token_sha256=? AND revoked_at IS NULL",
            (token_sha256,),
        ).fetchone()
        if row is None or now - row[2] > TOKEN_IDLE:
            return None
        if now - row[2] > TOKEN_TOUCH:
            self.db.execute("UPDATE tokens SET last_used=? WHERE token_sha256=?", (now, token_sha256))
        return User(row[0], row[1])

    def revoke_token(self, token_sha256: str) -> None:
        self.db.execute("UPDATE tokens SET revoked_at=? WHERE token_sha256=?", (time.time(), token_sha256))

    def tokens(self, user_id: int, current_sha256: str) -> list[LoginSession]:
        """The user's live log-ins, most recently used first."""
        horizon = time.time() - TOKEN_IDLE
        rows = self.db.execute(
            "SELECT rowid, client, created_at, COALESCE(last_used, created_at), token_sha256 FROM tokens "
            "WHERE user_id=? AND revoked_at IS NULL AND COALESCE(last_used, created_at) >= ? "
            "ORDER BY 4 DESC", (user_id, horizon),
        ).fetchall()
        return [LoginSession(r[0], r[1] or "unknown client", r[2], r[3], r[3] + TOKEN_IDLE,
                             r[4] == current_sha256) for r in rows]

    def revoke_token_id(self, user_id: int, session_id: int) -> bool:
        """Revoke the user's token ``session_id``; False if it has no such live token."""
        cursor = self.db.execute(
            "UPDATE tokens SET revoked_at=? WHERE rowid=? AND user_id=? AND revoked_at IS NULL",
            (time.time(), session_id, user_id))
        return cursor.rowcount == 1

    # --- collaboration state -------------------------------------------------------------

    def collaboration(self, project: str) -> tuple[int, str | None]:
        row = self.db.execute(
            "SELECT epoch, state_sha256 FROM collaborations WHERE project=?", (project,)
        ).fetchone()
        return (row[0], row[1]) if row else (0, None)

    def set_collaboration(self, project: str, epoch: int, state_sha256: str | None) -> None:
        self.db.execute(
            "INSERT INTO collaborations (project, epoch, state_sha256) VALUES (?,?,?) "
            "ON CONFLICT(project) DO UPDATE SET epoch=excluded.epoch, state_sha256=excluded.state_sha256",
            (project, epoch, state_sha256),
        )

    def last_round_id(self) -> int:
        return self.db.execute("SELECT MAX(COALESCE((SELECT MAX(round_id) FROM steps), 0), "
                               "COALESCE((SELECT MAX(round_id) FROM rounds), 0))").fetchone()[0]

    def round_opened(self, project: str, opened: RoundOpened) -> None:
        self.db.execute("INSERT OR REPLACE INTO rounds VALUES (?,?,?,?,?)",
                        (project, opened.round_id, opened.epoch, json.dumps(opened.voters), time.time()))

    def unsettled_round(self, project: str) -> RoundOpened | None:
        """The last round the project opened, if no step of it was recorded."""
        row = self.db.execute(
            "SELECT round_id, epoch, members FROM rounds WHERE project=? AND round_id > "
            "(SELECT COALESCE(MAX(round_id), 0) FROM steps WHERE project=?)", (project, project),
        ).fetchone()
        return RoundOpened(row[0], row[1], json.loads(row[2])) if row else None

    def record_step(self, project: str, step: Step) -> None:
        """The step and the collaboration's new epoch, atomically."""
        db = self._transaction()
        try:
            db.execute(
                "INSERT OR IGNORE INTO steps VALUES (?,?,?,?,?,?,?,?,?)",
                (project, step.round_id, step.epoch, step.loss, step.samples, step.peers,
                 step.round_seconds, step.state_sha256, time.time()),
            )
            self.set_collaboration(project, step.epoch, step.state_sha256)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def steps(self, project: str) -> list[Step]:
        rows = self.db.execute(
            "SELECT round_id, epoch, loss, samples, peers, round_seconds, state_sha256 FROM steps "
            "WHERE project=? ORDER BY round_id", (project,),
        ).fetchall()
        return [Step(round_id=r, epoch=e, loss=loss, samples=n, peers=peers, round_seconds=seconds,
                     state_sha256=digest) for r, e, loss, n, peers, seconds, digest in rows]

    def update_checkpoint_hash(self, project: str, epoch: int, state_sha256: str) -> None:
        self.db.execute("UPDATE checkpoints SET state_sha256=? WHERE project=? AND epoch=?",
                        (state_sha256, project, epoch))

    def epoch_state(self, project: str, epoch: int) -> str | None:
        row = self.db.execute(
            "SELECT state_sha256 FROM steps WHERE project=? AND epoch=? ORDER BY round_id DESC LIMIT 1",
            (project, epoch),
        ).fetchone()
        return row[0] if row else None

    # --- checkpoints ---------------------------------------------------------------------

    def add_checkpoint(self, project: str, info: CheckpointInfo) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?,?,?,?,?,?)",
            (project, info.epoch, info.sha256, info.state_sha256, info.size, time.time()),
        )

    def checkpoints(self, project: str) -> list[CheckpointInfo]:
        rows = self.db.execute(
            "SELECT epoch, sha256, state_sha256, size FROM checkpoints WHERE project=? "
            "ORDER BY epoch DESC", (project,),
        ).fetchall()
        return [CheckpointInfo(e, sha, psha, size, checkpoint_url(project, e)) for e, sha, psha, size in rows]

    def remove_checkpoint(self, project: str, epoch: int) -> None:
        self.db.execute("DELETE FROM checkpoints WHERE project=? AND epoch=?", (project, epoch))

    # --- peers and their sessions --------------------------------------------------------

    def add_peer(self, peer_id: str, project: str, name: str, token_sha256: str,
                 user_id: int | None, role: PeerRole = PeerRole.TRAINER) -> None:
        self.db.execute(
            "INSERT INTO peers (peer_id, project, name, token_sha256, user_id, joined_at, role) "
            "VALUES (?,?,?,?,?,?,?)", (peer_id, project, name, token_sha256, user_id, time.time(), str(role)),
        )

    def peer(self, peer_id: str, project: str) -> KnownPeer | None:
        """A peer of ``project``, as it joined (its role stays with it across reconnects)."""
        row = self.db.execute(
            "SELECT name, token_sha256, user_id, role FROM peers WHERE peer_id=? AND project=?",
            (peer_id, project),
        ).fetchone()
        return KnownPeer(row[0], row[1], row[2], PeerRole(row[3])) if row else None

    def peer_connected(self, peer_id: str, at: float | None = None) -> None:
        now = at if at is not None else time.time()
        self.db.execute("UPDATE peers SET connected_at=?, last_seen=?, left_at=NULL WHERE peer_id=?",
                        (now, now, peer_id))

    def peers_seen(self, peer_ids: list[str]) -> None:
        # One transaction, not one commit per peer: 1000 peers took 37 ms of the event loop.
        now = time.time()
        db = self._transaction()
        try:
            db.executemany("UPDATE peers SET last_seen=? WHERE peer_id=?", [(now, p) for p in peer_ids])
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def peer_left(self, peer_id: str, at: float | None = None) -> None:
        """Close the peer's session; its user's online time grows by the part of it that no
        other closed session of theirs covers (two peers for an hour are one hour online)."""
        db = self._transaction()
        try:
            row = db.execute(
                "SELECT project, user_id, connected_at FROM peers WHERE peer_id=? "
                "AND connected_at IS NOT NULL AND left_at IS NULL", (peer_id,),
            ).fetchone()
            if row is not None:
                project, user_id, started = row
                ended = max(at if at is not None else time.time(), started)
                db.execute("UPDATE peers SET left_at=?, last_seen=? WHERE peer_id=?", (ended, ended, peer_id))
                if user_id is not None:
                    others = db.execute(
                        "SELECT started, ended FROM sessions WHERE project=? AND user_id=? "
                        "AND ended > ? AND started < ?", (project, user_id, started, ended),
                    ).fetchall()
                    db.execute("INSERT INTO sessions VALUES (?,?,?,?,?)",
                               (project, user_id, peer_id, started, ended))
                    db.execute(
                        "INSERT INTO user_totals (project, user_id, online_seconds, last_seen) "
                        "VALUES (?,?,?,?) ON CONFLICT(project, user_id) DO UPDATE SET "
                        "online_seconds = online_seconds + excluded.online_seconds, "
                        "last_seen = MAX(last_seen, excluded.last_seen)",
                        (project, user_id, ended - started - _covered(started, ended, others), ended),
                    )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def prune_peers(self, now: float | None = None) -> int:
        """Forget peers that joined and never connected, or left long ago: join is cheap, and
        a row kept for ever for each would fill the disk. Their credit (contributions, with
        their users), online time (sessions) and totals do not depend on these rows."""
        now = now if now is not None else time.time()
        cursor = self.db.execute(
            "DELETE FROM peers WHERE (connected_at IS NULL AND joined_at < ?) OR left_at < ?",
            (now - NEVER_CONNECTED_KEPT, now - LEFT_KEPT))
        return cursor.rowcount

    def close_stale_sessions(self) -> None:
        """After a crash: sessions that never ended count until their peer was last seen."""
        rows = self.db.execute(
            "SELECT peer_id, last_seen FROM peers WHERE connected_at IS NOT NULL AND left_at IS NULL"
        ).fetchall()
        for peer_id, last_seen in rows:
            self.peer_left(peer_id, at=last_seen)


def checkpoint_url(project: str, epoch: int) -> str:
    return f"/api/projects/{project}/checkpoints/{epoch}"


def _covered(start: float, end: float, intervals: list[tuple[float, float]]) -> float:
    """How much of [start, end] the union of ``intervals`` covers."""
    covered, reach = 0.0, start
    for lo, hi in sorted(intervals):
        lo, hi = max(lo, reach), min(hi, end)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered
