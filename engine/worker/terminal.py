"""The worker's front end in a terminal: ``cotrain`` without a display does what the app
does -- contribute to the project chosen in the app (on first run, demo-lm hosted on this
computer) within the limits set in its Settings -- with live text stats, until Ctrl-C. The
app reads its settings and hands them over as ``Choices``; nothing here needs Qt."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from dataclasses import dataclass, field

from engine import aio
from engine.console import bar
from engine.credentials import CredentialStore
from engine.governor.limits import Limits, default_limits
from engine.peer.events import PeerEvent, StatusChanged
from engine.peer.report import ConsoleReporter
from engine.worker import protocol as p
from engine.worker.session import Session

DEFAULT_PROJECT = "demo-lm"


@dataclass
class Choices:
    """What the user chose in the app, as far as the terminal honours it."""

    limits: Limits = field(default_factory=default_limits)
    backbone: str = p.LOCAL_BACKBONE
    project: str = DEFAULT_PROJECT
    note: str = ""


class TerminalView:
    """Peer events as ``cotrain peer`` prints them; the live line from the worker's stats."""

    def __init__(self) -> None:
        self.reporter = ConsoleReporter()
        self.line = self.reporter.line
        self._state: tuple[bool, str] | None = None

    def peer_event(self, event: PeerEvent) -> None:
        if not isinstance(event, StatusChanged):  # the stats line below says more
            self.reporter(event)

    def __call__(self, event: p.WorkerEvent) -> None:
        if isinstance(event, p.Hosting):
            self.line.say(f"hosting the local backbone on this computer at {event.url} (Ctrl-C to stop)")
        elif isinstance(event, p.GovernorDecided):
            if (event.running, event.reason) != self._state:
                self._state = (event.running, event.reason)
                self.line.say("contributing" if event.running else f"paused: {event.reason}")
        elif isinstance(event, p.Problem):
            self.line.say(f"problem: {event.message}")
        elif isinstance(event, p.Stats):
            eta = f", next step in ~{event.eta_seconds:.0f}s" if event.eta_seconds is not None else ""
            loss = f", loss {event.loss:.3f}" if event.loss is not None else ""
            self.line.update(
                f"epoch {event.epoch} {bar(event.collab_samples / max(event.collab_target, 1))} "
                f"{event.collab_samples}/{event.collab_target}{eta}; {event.peers} peers; mine "
                f"{event.samples_per_second:.1f} samples/s, {event.my_samples_session:,} this session, "
                f"{event.my_samples_total:,} in total{loss}")


async def contribute(choices: Choices) -> int:
    view = TerminalView()
    view.line.say("No display: contributing from the terminal. The desktop app opens when a display "
                  "is available (DISPLAY or WAYLAND_DISPLAY).")
    if choices.note:
        view.line.say(choices.note)
    token = None
    if choices.backbone != p.LOCAL_BACKBONE:
        login = await asyncio.to_thread(CredentialStore().load, choices.backbone)
        token = login.token if login else None
    view.line.say(f"limits from the app's Settings: {choices.limits.describe()}")
    session = Session(view, on_peer_event=view.peer_event)
    await session.handle(p.SetLimits(limits=choices.limits))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    governing = asyncio.ensure_future(session.run_governor())
    try:
        await session.start(p.Start(backbone=choices.backbone, project=choices.project, token=token,
                                    name=socket.gethostname()))
        await stop.wait()
    finally:
        governing.cancel()
        view.line.say("stopping…")
        await session.close()
    return 0


def run(choices: Choices) -> int:
    return aio.run(contribute(choices))
