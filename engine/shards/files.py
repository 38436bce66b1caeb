"""A project's files as local paths, for the task that reads them on the compute thread.

``FetchedFiles`` is a peer's: each file is fetched on the peer's event loop when first asked
for (or ahead, with ``prefetch``), checked, and cached within the disk limit. ``FolderFiles``
reads a project folder on this computer (authoring, checks, tests).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import aiohttp

from engine.project import FileRef
from engine.project_folders import is_url
from engine.shards.cache import DiskBusy, ShardCache
from engine.shards.download import FileError, fetch_file, hash_file
from engine.shards.lock import exclusive
from engine.transport.shaping import RateLimiter

log = logging.getLogger(__name__)
ATTEMPTS = 4  # a download that stops is resumed this many times before the file is given up
FIRST_PAUSE = 2.0
ROOM_WAIT = 0.25  # seconds between two looks for room that other downloads hold
READ_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=30)
KEEP_IDLE = 5.0


class Files(Protocol):
    def local(self, ref: FileRef) -> Path:
        """The file on this computer, checked; FileError if it cannot be had."""

    def prefetch(self, ref: FileRef) -> None:
        """Start getting the file now, for a later ``local``."""


class FolderFiles:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._checked: set[str] = set()

    def local(self, ref: FileRef) -> Path:
        if is_url(ref.path):
            raise FileError(f"{ref.path} is not in the project's folder")
        path = self.root / ref.path
        if ref.sha256 not in self._checked:
            try:
                digest = hash_file(path).hexdigest()
            except OSError as exc:
                raise FileError(f"cannot read {path}: {exc.strerror or exc}") from None
            if digest != ref.sha256:
                raise FileError(f"{path} is not the file the project lists (its sha256 differs)", bad=True)
            self._checked.add(ref.sha256)
        return path

    def prefetch(self, ref: FileRef) -> None:
        pass


class FetchedFiles:
    """Files of a project on a backbone (paths) or anywhere on the web (URLs)."""

    def __init__(self, files_url: str, headers: Callable[[], dict[str, str]], cache: ShardCache,
                 loop: asyncio.AbstractEventLoop, progress: Callable[[str, int, int], None] | None = None,
                 limiter: RateLimiter | None = None) -> None:
        self.files_url = files_url.rstrip("/")
        self.headers = headers
        self.cache = cache
        self.loop = loop
        self.progress = progress
        self.limiter = limiter
        self._fetching: dict[str, asyncio.Future[Path]] = {}
        self._http: aiohttp.ClientSession | None = None

    def local(self, ref: FileRef) -> Path:
        found = self.cache.find(ref)
        if found is not None:
            return found
        return asyncio.run_coroutine_threadsafe(self.get(ref), self.loop).result()

    def prefetch(self, ref: FileRef) -> None:
        if self.cache.find(ref) is None:
            self.loop.call_soon_threadsafe(lambda: self._start(ref))

    async def get(self, ref: FileRef) -> Path:
        return await asyncio.shield(self._start(ref))

    async def close(self) -> None:
        for future in self._fetching.values():
            future.cancel()
        if self._http is not None:
            await self._http.close()

    def _start(self, ref: FileRef) -> asyncio.Future[Path]:
        future = self._fetching.get(ref.sha256)
        if future is None or (future.done() and (future.cancelled() or future.exception())):
            future = self._fetching[ref.sha256] = asyncio.ensure_future(self._fetch(ref))
        return future

    async def _fetch(self, ref: FileRef) -> Path:
        # Another process of this computer may be fetching it: wait for it, then look again.
        async with exclusive(self.cache.lock(ref)):
            return await self._download(ref)

    async def _download(self, ref: FileRef) -> Path:
        found = self.cache.find(ref)
        if found is not None:
            return found
        while True:
            try:
                self.cache.make_room(ref, keep=self._fetching)
                break
            except DiskBusy as exc:  # (others' downloads end, stored or given up: room frees)
                log.info("%s", exc)
                await asyncio.sleep(ROOM_WAIT)
        if self._http is None:
            # A backbone closes a connection idle for 10 s: one idle longer is never reused.
            self._http = aiohttp.ClientSession(timeout=READ_TIMEOUT,
                                               connector=aiohttp.TCPConnector(keepalive_timeout=KEEP_IDLE))
        url = ref.path if is_url(ref.path) else f"{self.files_url}/{ref.path}"
        headers = {} if is_url(ref.path) else self.headers()
        progress = self.progress
        report = (lambda got, total: progress(ref.path, got, total)) if progress else None
        try:
            return await self._fetch_into_cache(ref, url, headers, report)
        finally:
            self.cache.release(ref)

    async def _fetch_into_cache(self, ref: FileRef, url: str, headers: dict[str, str],
                                report: Callable[[int, int], None] | None) -> Path:
        assert self._http is not None
        pause, attempt, refetched = FIRST_PAUSE, 1, False
        while True:
            try:
                await fetch_file(self._http, url, headers, ref, self.cache.part(ref), self.limiter, report,
                                 READ_TIMEOUT)
                return self.cache.store(ref)
            except FileError as exc:
                if (exc.bad and refetched) or attempt == ATTEMPTS:
                    raise
                refetched, attempt = refetched or exc.bad, attempt + 1
                log.info("%s; trying again in %.0f s", exc, pause)
                await asyncio.sleep(pause)
                pause *= 2

