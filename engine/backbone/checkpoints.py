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
        expected_params_sha256: str, max_bytes: int,
    ) -> tuple[Path, str, int]:
        """Stream an upload to disk; keep it only if its checksum, epoch and parameter hash
        are the ones expected. Returns (path, sha256, size)."""
        folder = self.root / project
        folder.mkdir(parents=True, exist_ok=True)
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
            await asyncio.to_thread(_verify, tmp, epoch, expected_params_sha256)
            final = self.path(project, epoch)
            os.replace(tmp, final)
            _fsync_dir(folder)
            return final, digest.hexdigest(), size
        finally:
            tmp.unlink(missing_ok=True)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)


def _verify(path: Path, epoch: int, params_sha256: str) -> None:
    try:
        state = decode_file(path.read_bytes())
    except ProtocolError as exc:
        raise CheckpointRejected(f"not a valid state file: {exc}") from None
    if state.meta.epoch != epoch:
        raise CheckpointRejected(f"file holds epoch {state.meta.epoch}, not {epoch}")
    if state.params_sha256() != params_sha256:
        raise CheckpointRejected("parameters differ from the collaboration's at that epoch")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
