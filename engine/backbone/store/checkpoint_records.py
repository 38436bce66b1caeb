"""The checkpoints a project keeps: which epoch, which state, how large (the files are
engine/backbone/checkpoints.py's)."""

from __future__ import annotations

import time

from engine.backbone.store.database import Repository
from engine.wire.control import CheckpointInfo


class CheckpointRecords(Repository):
    def add(self, project: str, info: CheckpointInfo) -> None:
        self.db.execute(
            "INSERT INTO checkpoints VALUES (?,?,?,?,?,?) ON CONFLICT (project, epoch) DO UPDATE SET "
            "sha256=excluded.sha256, state_sha256=excluded.state_sha256, size=excluded.size, "
            "created_at=excluded.created_at",
            (project, info.epoch, info.sha256, info.state_sha256, info.size, time.time()),
        )

    def listed(self, project: str) -> list[CheckpointInfo]:
        rows = self.db.execute(
            "SELECT epoch, sha256, state_sha256, size FROM checkpoints WHERE project=? "
            "ORDER BY epoch DESC", (project,),
        ).fetchall()
        return [CheckpointInfo(e, sha, psha, size, checkpoint_url(project, e)) for e, sha, psha, size in rows]

    def remove(self, project: str, epoch: int) -> None:
        self.db.execute("DELETE FROM checkpoints WHERE project=? AND epoch=?", (project, epoch))

    def in_use(self, sha256: str) -> bool:
        """Whether any project keeps the file of this content (files are named by it)."""
        row = self.db.execute("SELECT 1 FROM checkpoints WHERE sha256=? LIMIT 1", (sha256,)).fetchone()
        return row is not None

    def update_hash(self, project: str, epoch: int, state_sha256: str) -> None:
        self.db.execute("UPDATE checkpoints SET state_sha256=? WHERE project=? AND epoch=?",
                        (state_sha256, project, epoch))


def checkpoint_url(project: str, epoch: int) -> str:
    return f"/api/projects/{project}/checkpoints/{epoch}"
