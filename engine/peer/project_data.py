"""A peer's project task: what it will take is checked against the volunteer's limits before
anything is downloaded, then the task reads the project's files through the shard cache."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import psutil

from engine.governor.limits import Limits
from engine.paths import user_data_dir
from engine.peer.events import FileProgress, PeerEvent
from engine.project import ProjectSpec
from engine.shards.cache import GB, ShardCache
from engine.shards.files import FetchedFiles
from engine.tasks import Task, TaskData, create_task
from engine.transport.shaping import RateLimiter

log = logging.getLogger(__name__)
MB = 2**20


class ProjectRefused(ValueError):
    """This computer cannot take part in the project as the volunteer set it up; trying
    again will not change that."""

    fatal = True


def check_fits(project: ProjectSpec, task: Task, limits: Limits) -> None:
    """Refuse, with the figures, a project whose model or data do not fit this computer."""
    needed = task.memory_needed()
    if needed is not None:
        ceiling = min(limits.max_memory_mb * MB if limits.max_memory_mb else float("inf"),
                      psutil.virtual_memory().total)
        if needed > ceiling:
            raise ProjectRefused(
                f"{project.title} needs about {needed // MB:,} MB of memory for its model and data; this "
                f"computer lets Cotrain use {int(ceiling) // MB:,} MB. Raise the memory limit in Settings or "
                "choose another project.")
    data = project.data
    if data is not None:
        largest = max(f.bytes for f in data.files())
        if largest > limits.max_disk_gb * GB:
            raise ProjectRefused(
                f"{project.title} has files of {largest / GB:.1f} GB; the disk limit is "
                f"{limits.max_disk_gb:g} GB. Raise it in Settings (or with --max-disk) to take part.")


def project_task(project: ProjectSpec, files_url: str, headers: Callable[[], dict[str, str]], limits: Limits,
                 corpus_dir: str | None, loop: asyncio.AbstractEventLoop, emit: Callable[[PeerEvent], None],
                 download: RateLimiter) -> tuple[Task, FetchedFiles | None]:
    """The project's task, its files fetched on demand (run off the event loop)."""
    files = None
    if project.data is not None:
        cache = ShardCache(user_data_dir() / "shards", int(limits.max_disk_gb * GB))
        files = FetchedFiles(files_url, headers, cache, loop,
                             lambda path, got, total: emit(FileProgress(path, got, total)), download)
    task = create_task(project.task, dict(project.task_params), TaskData(project.data, files, corpus_dir))
    check_fits(project, task, limits)
    return task, files
