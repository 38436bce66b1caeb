"""A collaboration's settled record: its epoch and state, each settled step, and the last
round each project opened (to settle it after a restart). A settled step and the
collaboration's new epoch are one transaction."""

from __future__ import annotations

import json
import time

from engine.backbone.store.database import Repository, Runner
from engine.backbone.tracker.outputs import RoundOpened
from engine.wire.control import Step


class RoundRecords(Repository):
    def collaboration(self, project: str) -> tuple[int, str | None]:
        row = self.db.execute(
            "SELECT epoch, state_sha256 FROM collaborations WHERE project=?", (project,)
        ).fetchone()
        return (row[0], row[1]) if row else (0, None)

    def set_collaboration(self, project: str, epoch: int, state_sha256: str | None,
                          db: Runner | None = None) -> None:
        """(``db``: the transaction it is part of.)"""
        (db or self.db).execute(
            "INSERT INTO collaborations (project, epoch, state_sha256) VALUES (?,?,?) "
            "ON CONFLICT(project) DO UPDATE SET epoch=excluded.epoch, state_sha256=excluded.state_sha256",
            (project, epoch, state_sha256),
        )

    def last_round_id(self) -> int:
        latest = self.dialect.greatest("COALESCE((SELECT MAX(round_id) FROM steps), 0)",
                                       "COALESCE((SELECT MAX(round_id) FROM rounds), 0)")
        return self.db.execute(f"SELECT {latest}").fetchone()[0]

    def round_opened(self, project: str, opened: RoundOpened, db: Runner | None = None) -> None:
        (db or self.db).execute("INSERT INTO rounds VALUES (?,?,?,?,?) ON CONFLICT (project) DO UPDATE SET "
                        "round_id=excluded.round_id, epoch=excluded.epoch, members=excluded.members, "
                        "opened_at=excluded.opened_at",
                        (project, opened.round_id, opened.epoch, json.dumps(opened.voters), time.time()))

    def unsettled_round(self, project: str) -> RoundOpened | None:
        """The last round the project opened, if no step of it was recorded."""
        row = self.db.execute(
            "SELECT round_id, epoch, members FROM rounds WHERE project=? AND round_id > "
            "(SELECT COALESCE(MAX(round_id), 0) FROM steps WHERE project=?)", (project, project),
        ).fetchone()
        return RoundOpened(row[0], row[1], json.loads(row[2])) if row else None

    def record_step(self, project: str, step: Step, db: Runner | None = None) -> None:
        """The step and the collaboration's new epoch, atomically (in ``db``, the
        transaction it is part of, if given)."""
        if db is None:
            with self._transaction() as db:
                self.record_step(project, step, db)
            return
        db.execute(
            "INSERT INTO steps VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
            (project, step.round_id, step.epoch, step.loss, step.samples, step.peers,
             step.round_seconds, step.state_sha256, time.time()),
        )
        self.set_collaboration(project, step.epoch, step.state_sha256, db)

    def steps(self, project: str) -> list[Step]:
        rows = self.db.execute(
            "SELECT round_id, epoch, loss, samples, peers, round_seconds, state_sha256 FROM steps "
            "WHERE project=? ORDER BY round_id", (project,),
        ).fetchall()
        return [Step(round_id=r, epoch=e, loss=loss, samples=n, peers=peers, round_seconds=seconds,
                     state_sha256=digest) for r, e, loss, n, peers, seconds, digest in rows]

    def epoch_state(self, project: str, epoch: int) -> str | None:
        row = self.db.execute(
            "SELECT state_sha256 FROM steps WHERE project=? AND epoch=? ORDER BY round_id DESC LIMIT 1",
            (project, epoch),
        ).fetchone()
        return row[0] if row else None
