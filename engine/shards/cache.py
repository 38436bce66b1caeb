"""The shard cache: files by content (their sha256) in the data folder, within the disk limit
the volunteer set; the least recently used go first when a new one needs the room.

A download reserves its whole size when it starts (a ``.reserved`` file beside its partial
one, counted while its lock is held): counted at their partial sizes, three 8 MB downloads
started together under a 10 MB limit each found room and held 24 MB."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from pathlib import Path

from engine.project import FileRef
from engine.shards.lock import held

log = logging.getLogger(__name__)
GB = 10**9


class DiskLimitError(RuntimeError):
    pass


class DiskBusy(DiskLimitError):
    """It would fit but for other downloads under way: their room frees once they end."""


class ShardCache:
    def __init__(self, root: Path, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.partial = root / "partial"  # downloads under way, kept to resume
        self.partial.mkdir(parents=True, exist_ok=True)
        self._clock = 0

    def path(self, ref: FileRef) -> Path:
        return self.root / ref.sha256

    def part(self, ref: FileRef) -> Path:
        return self.partial / ref.sha256

    def lock(self, ref: FileRef) -> Path:
        return self.partial / f"{ref.sha256}.lock"

    def reservation(self, ref: FileRef) -> Path:
        return self.partial / f"{ref.sha256}.reserved"

    def find(self, ref: FileRef) -> Path | None:
        """The cached file, marked as just used; None if it is not (wholly) here."""
        path = self.path(ref)
        try:
            if path.stat().st_size != ref.bytes:
                return None
            # Strictly later than any use before: two uses in one clock tick keep their order.
            self._clock = max(time.time_ns(), self._clock + 1)
            os.utime(path, ns=(self._clock, self._clock))
        except OSError:
            return None
        return path

    def used(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def make_room(self, ref: FileRef, keep: Iterable[str] = ()) -> None:
        """Evict least recently used files until ``ref`` fits; DiskLimitError if it cannot."""
        if ref.bytes > self.max_bytes:
            raise DiskLimitError(f"{ref.path} needs {ref.bytes / GB:.2f} GB; the disk limit is "
                                 f"{self.max_bytes / GB:.2f} GB")
        kept = {*keep, ref.sha256}
        entries = sorted(self._entries(), key=lambda e: e[2])  # least recently used first
        reserved = self._reserved(ref)
        total = sum(size for _, size, _ in entries) + reserved
        for path, size, _ in entries:
            if total + ref.bytes <= self.max_bytes:
                return
            if path.name in kept or path.parent != self.root:
                continue  # in use, or a download under way (perhaps another process's)
            log.info("disk limit: removing %s (%d bytes), used least recently", path.name, size)
            path.unlink(missing_ok=True)
            total -= size
        if total + ref.bytes > self.max_bytes and total - reserved + ref.bytes <= self.max_bytes:
            raise DiskBusy(f"{ref.path} waits for room: other downloads hold {reserved / GB:.2f} GB")
        if total + ref.bytes > self.max_bytes:
            raise DiskLimitError(f"the files in use take {total / GB:.2f} GB; {ref.path} needs "
                                 f"{ref.bytes / GB:.2f} GB more than the disk limit of "
                                 f"{self.max_bytes / GB:.2f} GB allows")
        self.reservation(ref).write_text(str(ref.bytes))

    def release(self, ref: FileRef) -> None:
        """The download of ``ref`` ended (stored, or given up): its room is no longer held."""
        self.reservation(ref).unlink(missing_ok=True)

    def store(self, ref: FileRef) -> Path:
        os.replace(self.part(ref), self.path(ref))
        self.release(ref)
        found = self.find(ref)  # marked as just used
        assert found is not None
        return found

    def _reserved(self, ref: FileRef) -> int:
        """The bytes other downloads under way still need beyond their partial files. A
        reservation whose download no longer holds its lock (a crashed process) is dropped."""
        total = 0
        for path in self.partial.glob("*.reserved"):
            sha = path.name.removesuffix(".reserved")
            if sha == ref.sha256:
                continue
            if not held(self.partial / f"{sha}.lock"):
                path.unlink(missing_ok=True)
                continue
            try:
                declared = int(path.read_text())
            except (OSError, ValueError):
                continue  # (written this instant, or removed)
            part = self.partial / sha
            total += max(declared - (part.stat().st_size if part.exists() else 0), 0)
        return total

    def _entries(self) -> list[tuple[Path, int, int]]:
        """(path, bytes, last used) of every file here, downloads under way included."""
        entries = []
        for folder in (self.root, self.partial):
            for path in folder.iterdir():
                if path.is_file() and path.suffix not in (".lock", ".reserved"):
                    stat = path.stat()
                    entries.append((path, stat.st_size, stat.st_mtime_ns))
        return entries
