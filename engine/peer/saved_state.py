"""The state a peer holds, written to a file as it leaves (``cotrain peer --save-state``): a
volunteer's own copy of the model it helped train, and what a benchmark scores at the end
of its run; or kept in memory for the next peer when the project changed under it. The
file is a Cotrain state file (engine/wire/tensors.py), the checkpoints' format; it is
replaced whole or not at all."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

from engine.training.optimizer import CollaborativeOptimizer
from engine.wire.tensors import encode_file

log = logging.getLogger(__name__)


async def save_state(optimizer: CollaborativeOptimizer, path: Path) -> None:
    """Save, even when asked to stop again meanwhile (a peer leaving at ``--max-epochs`` as
    its user presses Ctrl-C, once or more): such a stop waits for the file, then is raised."""
    saving = asyncio.ensure_future(_save(optimizer, path))
    stopped = False
    while not saving.done():
        try:
            await asyncio.shield(saving)
        except asyncio.CancelledError:
            stopped = True
    if stopped:
        raise asyncio.CancelledError


async def _save(optimizer: CollaborativeOptimizer, path: Path) -> None:
    index, payload = await optimizer.snapshot()
    meta = index.meta

    def write() -> None:
        partial = path.with_name(f".{path.name}.partial")
        try:
            with open(partial, "wb") as out:
                out.write(encode_file(index, payload))
                out.flush()
                os.fsync(out.fileno())
            os.replace(partial, path)
        except OSError:
            partial.unlink(missing_ok=True)
            raise

    try:
        await asyncio.to_thread(write)
    except OSError as exc:
        log.warning("could not save the state to %s: %s", path, exc)
        return
    log.info("saved the state of epoch %d (%s) to %s", meta.epoch, meta.state_sha256[:12], path)


async def carried_state(optimizer: CollaborativeOptimizer) -> bytes:
    index, payload = await optimizer.snapshot()
    return bytes(encode_file(index, payload))
