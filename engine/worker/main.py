"""``cotrain worker``: reads protocol commands on stdin, writes events on stdout, logs to stderr.

stdout carries the protocol only: the real descriptor is kept for events and descriptor 1
is pointed at stderr, so a stray print in any library lands in the log instead of
corrupting the stream. Closed stdin (the app went away) stops the worker like ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import BinaryIO

from engine import aio
from engine.wire import ProtocolError
from engine.worker import protocol as p
from engine.worker.session import Session

log = logging.getLogger(__name__)


class EventWriter:
    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream

    def __call__(self, event: p.WorkerEvent) -> None:
        try:
            self.stream.write(p.encode_line(event))
            self.stream.flush()
        except (BrokenPipeError, ValueError):  # the app is gone; stdin's EOF ends us next
            log.debug("dropped %s: nobody is listening", type(event).__name__)


def _read_stdin(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> None:
    """A thread, because reading a pipe asynchronously is not portable (Windows). Raw reads:
    a daemon thread blocked inside sys.stdin's buffered reader aborts the interpreter at exit."""
    fd, pending = sys.stdin.fileno(), b""
    while chunk := os.read(fd, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            loop.call_soon_threadsafe(queue.put_nowait, line)
    loop.call_soon_threadsafe(queue.put_nowait, None)


async def serve(emit: EventWriter, catalog: Path | None = None) -> int:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, queue.put_nowait, None)
    threading.Thread(target=_read_stdin, args=(loop, queue), daemon=True, name="stdin").start()
    session = Session(emit, catalog=catalog)
    governing = asyncio.ensure_future(session.run_governor())
    emit(p.Hello(version=p.VERSION, pid=os.getpid()))
    try:
        while (line := await queue.get()) is not None:
            if not line.strip():
                continue
            try:
                command = p.commands.decode(line)
            except ProtocolError as exc:
                emit(p.Problem(message=f"ignored a command: {exc}"))
                continue
            if isinstance(command, p.Stop):
                break
            # Joining and leaving take a while; pause and friends must not wait behind them.
            aio.spawn(session.handle(command))
    finally:
        governing.cancel()
        await session.close()
    return 0


def run(catalog: Path | None = None) -> int:
    events = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return aio.run(serve(EventWriter(events), catalog))
