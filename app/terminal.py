"""``cotrain`` without a display: what the app does — contribute to the project chosen in the
app (on first run, demo-lm hosted on this computer) within the limits set in its Settings —
with live text stats in the terminal, until Ctrl-C. No Qt widgets here: QtCore only reads the
app's settings file, and without PySide6 the defaults apply."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from dataclasses import dataclass, field

from engine import aio
from engine.console import bar
from engine.credentials import CredentialStore
from engine.governor.limits import Limits
from engine.peer.events import Event as PeerEvent
from engine.peer.events import StatusChanged
from engine.peer.report import ConsoleReporter
from engine.worker import protocol as p
from engine.worker.session import LOCAL, Session

PROJECT = "demo-lm"


@dataclass
class Choices:
    """What the user chose in the app, as far as the terminal honours it."""

    limits: Limits = field(default_factory=Limits)
    backbone: str = LOCAL
    project: str = PROJECT
    note: str = ""


def saved_choices() -> Choices:
    try:
        from app.settings_store import SettingsStore
    except ImportError as exc:
        return Choices(note=f"cannot read the app's settings ({exc}); using the default limits")
    store = SettingsStore()
    current = store.current()
    if current is None:
        return Choices(store.limits(), note=f"you left every project in the app; contributing to "
                                            f"{PROJECT} on this computer")
    return Choices(store.limits(), current.backbone, current.project)


class TerminalView:
    """Peer events as ``cotrain peer`` prints them; the live line from the worker's stats."""

    def __init__(self) -> None:
        self.reporter = ConsoleReporter()
        self.line = self.reporter.line
        self._state: tuple[bool, str] | None = None

    def peer_event(self, event: PeerEvent) -> None:
        if not isinstance(event, StatusChanged):  # the stats line below says more
            self.reporter(event)

    def __call__(self, event: p.Event) -> None:
        if isinstance(event, p.Hosting):
            self.line.say(f"hosting the local backbone on this computer at {event.url} (Ctrl-C to stop)")
        elif isinstance(event, p.State):
            if (event.running, event.reason) != self._state:
                self._state = (event.running, event.reason)
                self.line.say("contributing" if event.running else f"paused: {event.reason}")
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
    choices = saved_choices()
    if choices.note:
        view.line.say(choices.note)
    token = None
    if choices.backbone != LOCAL:
        login = await asyncio.to_thread(CredentialStore().load, choices.backbone)
        token = login.token if login else None
    view.line.say(f"limits from the app's Settings: {choices.limits.describe()}")
    session = Session(view, on_peer_event=view.peer_event)
    await session.handle(p.SetLimits(choices.limits.to_dict()))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    governing = asyncio.ensure_future(session.run_governor())
    try:
        await session.start(p.Start(choices.backbone, choices.project, token, socket.gethostname()))
        await stop.wait()
    finally:
        governing.cancel()
        view.line.say("stopping…")
        await session.close()
    return 0


def run() -> int:
    return aio.run(contribute())
