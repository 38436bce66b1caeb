"""One download of a file at a time on this computer: the app's worker and a `cotrain peer`
share the data folder, and two writers of one partial file would corrupt it.

Waiting for the lock polls it without blocking: a thread blocked on a lock held by another
download would sit in asyncio's default executor, and a few of them (one per shard being
prefetched) starved everything else that runs there -- in a process that also runs a
backbone, the very file responses the lock holder was waiting for (CI saw three peers'
shard downloads stall for two minutes so).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

FIRST_WAIT = 0.02  # seconds between two looks at a busy lock, doubling
LONGEST_WAIT = 0.5


@contextlib.asynccontextmanager
async def exclusive(path: Path) -> AsyncIterator[None]:
    """Hold ``path`` (a lock file) until the block ends, waiting while another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        wait = FIRST_WAIT
        while not _try_lock(fd):
            await asyncio.sleep(wait)
            wait = min(2 * wait, LONGEST_WAIT)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _try_lock(fd: int) -> bool:
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def held(path: Path) -> bool:
    """Whether a download holds ``path`` now (in this process or another)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return False
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)  # (releases it if we just took it)
