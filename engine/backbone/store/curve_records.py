"""The learning curve: the loss of each settled step, and the held-out metric of the
states peers scored."""

from __future__ import annotations

import time

from engine.backbone.store.database import Repository
from engine.wire.rest import CurvePoint


class CurveRecords(Repository):
    def record_heldout(self, project: str, epoch: int, loss: float, accuracy: float | None,
                       scores: int) -> None:
        self.db.execute("INSERT INTO heldout VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (project, epoch) "
                        "DO UPDATE SET loss=excluded.loss, accuracy=excluded.accuracy, "
                        "scores=excluded.scores, scored_at=excluded.scored_at",
                        (project, epoch, loss, accuracy, scores, time.time()))

    def points(self, project: str) -> list[CurvePoint]:
        """Loss per epoch (the latest step of each epoch, after any rewind), with the held-out
        metric where peers scored that epoch's state."""
        rows = self.db.execute(
            "SELECT s.epoch, s.loss, s.samples, s.peers, s.round_seconds, s.finished_at, h.loss, h.accuracy "
            "FROM steps s LEFT JOIN heldout h ON h.project = s.project AND h.epoch = s.epoch "
            "WHERE s.project=? AND s.round_id = (SELECT MAX(round_id) FROM steps WHERE project=s.project "
            "AND epoch=s.epoch) ORDER BY s.epoch", (project,),
        ).fetchall()
        return [CurvePoint(*row) for row in rows]
