"""Checkpoint files on the backbone's disk: written atomically, verified, the last few kept."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from engine.wire import ProtocolError
from engine.wire.tensors import decode_file

log = logging.getLogger(__name__)
INCOMING = ".incoming-"  # an upload being received: renamed once verified, else removed
WRITE_SIZE = 1 << 20  # bytes gathered before each write (one thread hop per MiB, not per chunk)


class CheckpointRejected(ValueError):
    """An upload that is not the checkpoint it claims to be; nothing was kept."""


class CheckpointFiles:
    """Checkpoint files, the backbone's user's alone (files 0600, folders 0700). Uploads are
    written off the event loop: a fsync of a large file can take seconds, and every peer's
    messages would wait for it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, project: str, epoch: int) -> Path:
        return self.root / project / f"epoch-{epoch:08d}.ckpt"

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
        self, project: str, epoch: int, chunks: AsyncIterator[bytes], *, expected_sha256: str,
        expected_state_sha256: str, max_bytes: int,
    ) -> tuple[Path, str, int]:
        """Stream an upload to disk; keep it only if its checksum, epoch and state hash
        are the ones expected. Returns (path, sha256, size)."""
        folder = self.root / project
        tmp = folder / f"{INCOMING}{uuid.uuid4().hex}"
        fd = await asyncio.to_thread(_create, folder, tmp)
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
            final = self.path(project, epoch)
            await asyncio.to_thread(_publish, tmp, final)
            return final, digest.hexdigest(), size
        finally:
            await asyncio.to_thread(tmp.unlink, missing_ok=True)

    async def remove(self, path: Path) -> None:
        await asyncio.to_thread(path.unlink, missing_ok=True)

    def state_sha256(self, project: str, epoch: int) -> str | None:
        """The hash of the state a stored checkpoint holds (None: missing or unreadable)."""
        try:
            return decode_file(self.path(project, epoch).read_bytes()).state_sha256()
        except (OSError, ProtocolError) as exc:
            log.warning("%s: the checkpoint of epoch %d cannot be read: %s", project, epoch, exc)
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


def _create(folder: Path, tmp: Path) -> int:
    for private in (folder.parent, folder):  # inside the data directory, and as private as it
        private.mkdir(parents=True, exist_ok=True, mode=0o700)
    return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)


def _append(fd: int, digest: hashlib._Hash, data: bytes) -> None:
    digest.update(data)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _finish(fd: int, digest: hashlib._Hash, data: bytes) -> None:
    _append(fd, digest, data)
    os.fsync(fd)


def _publish(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    _fsync_dir(final.parent)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
