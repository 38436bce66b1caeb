"""The learning curve's tables (part of the Store): the loss of each settled step, and the
held-out metric of the states peers scored."""

from __future__ import annotations

import sqlite3
import time

from engine.wire.rest import CurvePoint

CURVE_SCHEMA = """
CREATE TABLE IF NOT EXISTS heldout (
    project TEXT NOT NULL, epoch INTEGER NOT NULL, loss REAL NOT NULL, accuracy REAL,
    scores INTEGER NOT NULL, scored_at REAL NOT NULL, PRIMARY KEY (project, epoch));
"""


class CurveTables:
    db: sqlite3.Connection

    def record_heldout(self, project: str, epoch: int, loss: float, accuracy: float | None,
                       scores: int) -> None:
        self.db.execute("INSERT OR REPLACE INTO heldout VALUES (?, ?, ?, ?, ?, ?)",
                        (project, epoch, loss, accuracy, scores, time.time()))

    def curve(self, project: str) -> list[CurvePoint]:
        """Loss per epoch (the latest step of each epoch, after any rewind), with the held-out
        metric where peers scored that epoch's state."""
        rows = self.db.execute(
            "SELECT s.epoch, s.loss, s.samples, s.peers, s.round_seconds, s.finished_at, h.loss, h.accuracy "
            "FROM steps s LEFT JOIN heldout h ON h.project = s.project AND h.epoch = s.epoch "
            "WHERE s.project=? AND s.round_id = (SELECT MAX(round_id) FROM steps WHERE project=s.project "
            "AND epoch=s.epoch) ORDER BY s.epoch", (project,),
        ).fetchall()
        return [CurvePoint(*row) for row in rows]
