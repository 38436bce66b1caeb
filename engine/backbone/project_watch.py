"""The project folders a backbone serves (``cotrain backbone --projects DIR``), looked at
again every few seconds, so a new or edited project needs no restart: a new folder is
offered, an edit is served once its folder checks out (its peers join again, to take it),
and an edit that changes the model of a collaboration holding a state is refused with its
reason and the way to start over (engine/project_changes.py): that state cannot take it."""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from engine.project import ProjectSpec
from engine.project_changes import changes, settings_text
from engine.project_folders import PROJECT_FILE, ProjectFolder, load_project_folder, load_project_folders
from engine.wire.codec import encode

if TYPE_CHECKING:
    from engine.backbone.server import Backbone

log = logging.getLogger(__name__)

WATCH_INTERVAL = 2.0  # seconds between looks at the folders
BETWEEN_ROUNDS = 0.05  # seconds between looks for the end of the round an edit waits for
ROUND_WAIT = 120.0  # the longest an edit waits for a round to end
CHANGED = b"the project changed; join again"


class ProjectWatch:
    def __init__(self, backbone: Backbone, directory: Path) -> None:
        self.backbone, self.directory = backbone, directory
        self.refused: dict[str, str] = {}  # project id -> why no version of its folder is served
        self._refused_at: dict[Path, str] = {}  # the folder each refused id was read from
        self._seen: dict[Path, tuple[int, int] | None] = {}  # project.json -> (mtime, size) last read
        self._waiting: dict[str, float] = {}  # project id -> since when its edit waits for a round's end

    def load_all(self) -> None:
        """At start, every folder (one that does not check out stops the start, as before)."""
        for folder in load_project_folders(self.directory):
            self._seen[folder.root / PROJECT_FILE] = _stamp(folder.root / PROJECT_FILE)
            self.admit(folder)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_scan = loop.time() + WATCH_INTERVAL
        while True:
            await asyncio.sleep(BETWEEN_ROUNDS if self._waiting else max(next_scan - loop.time(), 0))
            self._restart_between_rounds(loop.time())
            if loop.time() < next_scan:
                continue
            next_scan = loop.time() + WATCH_INTERVAL
            try:
                self.scan()
            except OSError as exc:
                log.warning("cannot look at the project folders in %s: %s", self.directory, exc)

    def scan(self) -> None:
        """Read each project.json that changed since it was last read."""
        for root in sorted(self.directory.iterdir()):
            path = root / PROJECT_FILE
            stamp = _stamp(path)
            if stamp is None or self._seen.get(path) == stamp:
                continue
            self._seen[path] = stamp
            try:
                folder = load_project_folder(root)
            except ValueError as exc:
                log.warning("%s is not served as it is now (what was served before stays): %s", root, exc)
                continue
            self.admit(folder)

    def admit(self, folder: ProjectFolder) -> bool:
        """Serve ``folder``'s version of its project, unless its model is not the one the
        collaboration's state was trained as; False (the reason logged) when refused."""
        spec, backbone = folder.spec, self.backbone
        served, before = backbone.projects.get(spec.id), backbone.folders.get(spec.id)
        if served is not None and (before is None or before.root != folder.root):
            log.error("%s: not served: another project has the id %r", folder.root, spec.id)
            return False
        settings, kept = settings_text(spec), backbone.store.models.settings(spec.id)
        epoch, _ = backbone.store.rounds.collaboration(spec.id)
        has_state = epoch > 0 or bool(backbone.store.checkpoints.listed(spec.id))
        if kept is not None and kept != settings and has_state:
            stays = "the version served before stays" if served else "the project is not served"
            why = (f"{folder.root / PROJECT_FILE} changes the model of a collaboration at step {epoch} "
                   f"({'; '.join(changes(kept, settings))}), which its state cannot take: {stays}. To start "
                   f"over from step 0 with this model, give the project a new id (\"id\" in {PROJECT_FILE}).")
            log.error("%s", why)
            if served is None:
                self.refused[spec.id], self._refused_at[folder.root] = why, spec.id
            return False
        backbone.store.models.keep(spec.id, settings, hashlib.sha256(encode(spec)).hexdigest())
        self.refused.pop(self._refused_at.pop(folder.root, spec.id), None)  # (its id may be new)
        if served is None:
            backbone.add_project(spec, folder)
            log.info("offering %s (%s) from %s", spec.id, spec.title, folder.root)
        elif encode(served) != encode(spec):
            self._replace(spec, folder)
        return True

    def _replace(self, spec: ProjectSpec, folder: ProjectFolder) -> None:
        """Joiners get the new version at once; once no round is under way (its peers then
        hold the settled state, to carry into the new version), the tracker starts again
        from the settled record, and the peers of the old version are sent to join again
        (their next connection is refused: store/project_models.py)."""
        backbone = self.backbone
        backbone.projects[spec.id], backbone.folders[spec.id] = spec, folder
        log.warning("%s: serving its edited %s; its peers join again", spec.id, folder.root / PROJECT_FILE)
        self._waiting.setdefault(spec.id, asyncio.get_running_loop().time())

    def _restart_between_rounds(self, now: float) -> None:
        backbone = self.backbone
        for project, since in list(self._waiting.items()):
            tracker = backbone.trackers.get(project)
            if tracker is not None and tracker.round is not None and now - since < ROUND_WAIT:
                continue
            del self._waiting[project]
            if tracker is not None:
                backbone.stop_tracker(project, "the project changed", CHANGED)
                backbone.start_tracker(project)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
