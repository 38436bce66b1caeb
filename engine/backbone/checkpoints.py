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


class CheckpointRejected(ValueError):
    """An upload that is not the checkpoint it claims to be; nothing was kept."""


class CheckpointFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, project: str, epoch: int) -> Path:
        return self.root / project / f"epoch-{epoch:08d}.ckpt"

    async def receive(
        self, project: str, epoch: int, chunks: AsyncIterator[bytes], *, expected_sha256: str,
        expected_state_sha256: str, max_bytes: int,
    ) -> tuple[Path, str, int]:
        """Stream an upload to disk; keep it only if its checksum, epoch and state hash
        are the ones expected. Returns (path, sha256, size)."""
        folder = self.root / project
        for private in (self.root, folder):  # inside the data directory, and as private as it
            private.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = folder / f".incoming-{uuid.uuid4().hex}"
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as fh:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise CheckpointRejected(f"checkpoint exceeds {max_bytes} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
            if digest.hexdigest() != expected_sha256:
                raise CheckpointRejected("checkpoint checksum does not match X-Content-SHA256")
            await asyncio.to_thread(_verify, tmp, epoch, expected_state_sha256)
            final = self.path(project, epoch)
            os.replace(tmp, final)
            _fsync_dir(folder)
            return final, digest.hexdigest(), size
        finally:
            tmp.unlink(missing_ok=True)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)

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


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
