"""The backbone's durable state in one SQLite file (WAL mode: a crash loses no committed row)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from engine.backbone.tracker import EpochRecord
from engine.wire.messages import CheckpointInfo

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS collaborations (
    project TEXT PRIMARY KEY, epoch INTEGER NOT NULL, params_sha256 TEXT
);
CREATE TABLE IF NOT EXISTS epochs (
    project TEXT NOT NULL, epoch INTEGER NOT NULL, loss REAL, samples INTEGER NOT NULL,
    peers INTEGER NOT NULL, round_seconds REAL NOT NULL, params_sha256 TEXT NOT NULL,
    finished_at REAL NOT NULL, PRIMARY KEY (project, epoch)
);
CREATE TABLE IF NOT EXISTS checkpoints (
    project TEXT NOT NULL, epoch INTEGER NOT NULL, file TEXT NOT NULL, sha256 TEXT NOT NULL,
    params_sha256 TEXT NOT NULL, size INTEGER NOT NULL, created_at REAL NOT NULL,
    PRIMARY KEY (project, epoch)
);
CREATE TABLE IF NOT EXISTS peers (
    peer_id TEXT PRIMARY KEY, project TEXT NOT NULL, name TEXT NOT NULL,
    token_sha256 TEXT NOT NULL, joined_at REAL NOT NULL, left_at REAL
);
"""


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("PRAGMA foreign_keys=ON")
        self.db.executescript(SCHEMA)
        row = self.db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif int(row[0]) > SCHEMA_VERSION:
            raise RuntimeError(f"{path} was written by a newer Cotrain (schema {row[0]})")

    def close(self) -> None:
        self.db.close()

    def collaboration(self, project: str) -> tuple[int, str | None]:
        row = self.db.execute(
            "SELECT epoch, params_sha256 FROM collaborations WHERE project=?", (project,)
        ).fetchone()
        return (row[0], row[1]) if row else (0, None)

    def record_epoch(self, project: str, rec: EpochRecord) -> None:
        with self.db:
            self.db.execute("BEGIN")
            self.db.execute(
                "INSERT OR REPLACE INTO epochs VALUES (?,?,?,?,?,?,?,?)",
                (project, rec.epoch, rec.loss, rec.samples, rec.peers, rec.round_seconds,
                 rec.params_sha256, time.time()),
            )
            self.db.execute(
                "INSERT OR REPLACE INTO collaborations VALUES (?,?,?)",
                (project, rec.epoch, rec.params_sha256),
            )

    def curve(self, project: str) -> list[dict]:
        rows = self.db.execute(
            "SELECT epoch, loss, samples, peers, round_seconds, finished_at FROM epochs "
            "WHERE project=? ORDER BY epoch", (project,),
        ).fetchall()
        keys = ("epoch", "loss", "samples", "peers", "round_seconds", "finished_at")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def epoch_params(self, project: str, epoch: int) -> str | None:
        row = self.db.execute(
            "SELECT params_sha256 FROM epochs WHERE project=? AND epoch=?", (project, epoch)
        ).fetchone()
        return row[0] if row else None

    def add_checkpoint(self, project: str, info: CheckpointInfo, file: str) -> None:
        self.db.execute(
            "INSERT OR REPLACE INTO checkpoints VALUES (?,?,?,?,?,?,?)",
            (project, info.epoch, file, info.sha256, info.params_sha256, info.size, time.time()),
        )

    def checkpoints(self, project: str) -> list[tuple[CheckpointInfo, str]]:
        rows = self.db.execute(
            "SELECT epoch, sha256, params_sha256, size, file FROM checkpoints WHERE project=? "
            "ORDER BY epoch DESC", (project,),
        ).fetchall()
        return [
            (CheckpointInfo(e, sha, psha, size, f"/api/projects/{project}/checkpoints/{e}"), file)
            for e, sha, psha, size, file in rows
        ]

    def remove_checkpoint(self, project: str, epoch: int) -> None:
        self.db.execute("DELETE FROM checkpoints WHERE project=? AND epoch=?", (project, epoch))

    def add_peer(self, peer_id: str, project: str, name: str, token_sha256: str) -> None:
        self.db.execute(
            "INSERT INTO peers VALUES (?,?,?,?,?,NULL)",
            (peer_id, project, name, token_sha256, time.time()),
        )

    def peer_token(self, peer_id: str, project: str) -> str | None:
        row = self.db.execute(
            "SELECT token_sha256 FROM peers WHERE peer_id=? AND project=?", (peer_id, project)
        ).fetchone()
        return row[0] if row else None

    def peer_left(self, peer_id: str) -> None:
        self.db.execute("UPDATE peers SET left_at=? WHERE peer_id=?", (time.time(), peer_id))
