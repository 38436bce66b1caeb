"""Checkpoint files on the backbone's disk: written atomically, verified, named by their
content's sha256. Names that never change meaning let several backbone processes share one
folder (a network file system): whichever process holds a project finds every checkpoint
any other stored, two uploads of the same state become one file, and no file is ever
rewritten under a reader."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from engine.wire import ProtocolError
from engine.wire.tensors import decode_file

log = logging.getLogger(__name__)
INCOMING = ".incoming-"  # an upload being received: renamed once verified, else removed
WRITE_SIZE = 1 << 20  # bytes gathered before each write (one thread hop per MiB, not per chunk)
# A file published this recently may be about to be recorded by another process: it stays.
# (Ages are read against this machine's clock: processes sharing a folder keep time by NTP.)
GRACE = 60.0
CONTENT_NAME = re.compile(r"[0-9a-f]{64}")


class CheckpointRejected(ValueError):
    """An upload that is not the checkpoint it claims to be; nothing was kept."""


class CheckpointFiles:
    """Checkpoint files, the backbone's user's alone (files 0600, folders 0700). Uploads are
    written off the event loop: a fsync of a large file can take seconds, and every peer's
    messages would wait for it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, sha256: str) -> Path:
        """Where the file whose content hashes to ``sha256`` lives (256 subfolders: a
        folder of thousands of files is slow on some file systems)."""
        return self.root / sha256[:2] / f"{sha256}.ckpt"

    def adopt(self, project: str, epoch: int, sha256: str) -> None:
        """Move a file an earlier Cotrain kept under its project and epoch to its content's
        name (checked: a file that is not that content stays where it is)."""
        old = self.root / project / f"epoch-{epoch:08d}.ckpt"
        if not old.is_file() or self.path(sha256).exists():
            return
        if _file_sha256(old) != sha256:
            log.warning("%s: %s does not hold the checkpoint recorded for epoch %d; left as it is",
                        project, old, epoch)
            return
        _publish(old, self.path(sha256))

    def tidy(self) -> None:
        """At start: remove uploads a crash left half-written, and make every folder and file
        private again (an older version, or a copy, may have left them readable)."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.root.chmod(0o700)
        for folder, dirs, files in os.walk(self.root):
            for mode, names in ((0o700, dirs), (0o600, files)):
                for name in names:
                    path = os.path.join(folder, name)
                    if os.path.islink(path):
                        continue
                    if mode == 0o600 and name.startswith(INCOMING):
                        log.info("removing %s, an upload that never finished", path)
                        os.unlink(path)
                    else:
                        os.chmod(path, mode)

    async def receive(
        self, epoch: int, chunks: AsyncIterator[bytes], *, expected_sha256: str,
        expected_state_sha256: str, max_bytes: int,
    ) -> tuple[Path, str, int]:
        """Stream an upload to disk; keep it only if its checksum, epoch and state hash
        are the ones expected. Returns (path, sha256, size)."""
        tmp = self.root / f"{INCOMING}{uuid.uuid4().hex}"
        fd = await asyncio.to_thread(_create, self.root, tmp)
        digest, size, pending = hashlib.sha256(), 0, bytearray()
        try:
            try:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise CheckpointRejected(f"checkpoint exceeds {max_bytes} bytes")
                    pending += chunk
                    if len(pending) >= WRITE_SIZE:
                        await asyncio.to_thread(_append, fd, digest, bytes(pending))
                        pending.clear()
                await asyncio.to_thread(_finish, fd, digest, bytes(pending))
            finally:
                os.close(fd)
            if digest.hexdigest() != expected_sha256:
                raise CheckpointRejected("checkpoint checksum does not match X-Content-SHA256")
            await asyncio.to_thread(_verify, tmp, epoch, expected_state_sha256)
            final = self.path(expected_sha256)
            await asyncio.to_thread(_publish, tmp, final)
            return final, expected_sha256, size
        finally:
            await asyncio.to_thread(tmp.unlink, missing_ok=True)

    async def remove(self, sha256: str) -> bool:
        """Remove a file no record names any more -- unless it was published within GRACE:
        then another process may be recording the same content (two uploads of one state)
        right now, and ``sweep`` removes it later if nobody did. True if it went."""
        return await asyncio.to_thread(_unlink_if_older, self.path(sha256), time.time() - GRACE)

    async def sweep(self, in_use: Callable[[str], bool]) -> int:
        """Remove the files older than GRACE that no record names (kept by ``remove``, or
        left by a process that died between its upload and its record); how many went.
        Only content-named files: one an older Cotrain kept by epoch stays for ``adopt``."""
        def sweep() -> int:
            removed, before = 0, time.time() - GRACE
            for path in self.root.glob("??/*.ckpt"):
                if (CONTENT_NAME.fullmatch(path.stem) and path.parent.name == path.stem[:2]
                        and not in_use(path.stem) and _unlink_if_older(path, before)):
                    removed += 1
            return removed

        return await asyncio.to_thread(sweep)

    def state_sha256(self, sha256: str) -> str | None:
        """The hash of the state a stored checkpoint holds (None: missing or unreadable)."""
        try:
            return decode_file(self.path(sha256).read_bytes()).state_sha256()
        except (OSError, ProtocolError) as exc:
            log.warning("the checkpoint file %s cannot be read: %s", self.path(sha256), exc)
            return None


def _verify(path: Path, epoch: int, state_sha256: str) -> None:
    try:
        state = decode_file(path.read_bytes())
    except ProtocolError as exc:
        raise CheckpointRejected(f"not a valid state file: {exc}") from None
    if state.meta.epoch != epoch:
        raise CheckpointRejected(f"file holds epoch {state.meta.epoch}, not {epoch}")
    if state.state_sha256() != state_sha256:
        raise CheckpointRejected("the state differs from the collaboration's at that epoch")


def _unlink_if_older(path: Path, before: float) -> bool:
    """Remove ``path`` if it was published before ``before``. It is moved aside first and
    judged there: a file another process published under the name meanwhile (fresh) goes
    back, rather than being removed on the word of a stat of the old one."""
    aside = path.parent / f"{INCOMING}{uuid.uuid4().hex}"
    try:
        if path.stat().st_mtime >= before:
            return False
        os.rename(path, aside)
    except FileNotFoundError:
        return False
    if aside.stat().st_mtime >= before:
        os.replace(aside, path)  # (the same content as anything published there since)
        return False
    aside.unlink()
    return True


def _create(folder: Path, tmp: Path) -> int:
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(WRITE_SIZE):
            digest.update(chunk)
    return digest.hexdigest()


def _append(fd: int, digest: hashlib._Hash, data: bytes) -> None:
    digest.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _finish(fd: int, digest: hashlib._Hash, data: bytes) -> None:
    _append(fd, digest, data)
    os.fsync(fd)


def _publish(tmp: Path, final: Path) -> None:
    """(The same content under the same name: replacing a file another process published
    meanwhile changes nothing a reader sees.)"""
    final.parent.mkdir(exist_ok=True, mode=0o700)
    os.utime(tmp)  # (its age counts from now: checking it may have taken longer than GRACE)
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
