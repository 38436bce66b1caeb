"""``cotrain`` without a display: what the app does on first run — host demo-lm on this
computer and train it — with live text stats in the terminal, until Ctrl-C. No Qt here."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from engine import aio
from engine.console import bar
from engine.peer.events import Event as PeerEvent
from engine.peer.events import StatusChanged
from engine.peer.report import ConsoleReporter
from engine.worker import protocol as p
from engine.worker.session import LOCAL, Session

PROJECT = "demo-lm"


class TerminalView:
    """Peer events as ``cotrain peer`` prints them; the live line from the worker's stats."""

    def __init__(self) -> None:
        self.reporter = ConsoleReporter()
        self.line = self.reporter.line

    def peer_event(self, event: PeerEvent) -> None:
        if not isinstance(event, StatusChanged):  # the stats line below says more
            self.reporter(event)

    def __call__(self, event: p.Event) -> None:
        if isinstance(event, p.Hosting):
            self.line.say(f"hosting {PROJECT} on this computer at {event.url} (Ctrl-C to stop)")
        elif isinstance(event, p.Error):
            self.line.say(f"problem: {event.message}")
        elif isinstance(event, p.Stats):
            eta = f", next step in ~{event.eta_seconds:.0f}s" if event.eta_seconds is not None else ""
            loss = f", loss {event.loss:.3f}" if event.loss is not None else ""
            self.line.update(
                f"epoch {event.epoch} {bar(event.collab_samples / max(event.collab_target, 1))} "
                f"{event.collab_samples}/{event.collab_target}{eta}; {event.peers} peers; mine "
                f"{event.samples_per_second:.1f} samples/s, {event.my_samples_session:,} this session, "
                f"{event.my_samples_total:,} in total{loss}")


async def contribute() -> int:
    view = TerminalView()
    view.line.say("No display: contributing from the terminal. The desktop app opens when a display "
                  "is available (DISPLAY or WAYLAND_DISPLAY).")
    session = Session(view, on_peer_event=view.peer_event)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    governing = asyncio.ensure_future(session.run_governor())
    try:
        await session.start(p.Start(LOCAL, PROJECT))
        await stop.wait()
    finally:
        governing.cancel()
        view.line.say("stopping…")
        await session.close()
    return 0


def run() -> int:
    return aio.run(contribute())
