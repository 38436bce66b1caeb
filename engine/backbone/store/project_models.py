"""What each project folder's collaboration was served under: the settings its state
depends on (engine/project_changes.py), as they were when its state began, so that an edit
changing them is refused while a state exists; and since when its current version is served,
so that a peer which joined an older version joins again."""

from __future__ import annotations

import time

from engine.backbone.store.database import Repository


class ProjectModelRecords(Repository):
    def settings(self, project: str) -> str | None:
        row = self.db.execute("SELECT settings FROM project_models WHERE project=?", (project,)).fetchone()
        return row[0] if row else None

    def since(self, project: str) -> float:
        """When the version served now began (0: the first version known)."""
        row = self.db.execute("SELECT since FROM project_models WHERE project=?", (project,)).fetchone()
        return row[0] if row else 0.0

    def keep(self, project: str, settings: str, version_sha256: str) -> None:
        """Serve this version: a new one (another hash) is served from now."""
        self.db.execute(
            "INSERT INTO project_models (project, settings, version_sha256, since) VALUES (?,?,?,0) "
            "ON CONFLICT(project) DO UPDATE SET settings=excluded.settings, "
            "since=CASE WHEN project_models.version_sha256 = excluded.version_sha256 "
            "THEN project_models.since ELSE ? END, version_sha256=excluded.version_sha256",
            (project, settings, version_sha256, time.time()))
