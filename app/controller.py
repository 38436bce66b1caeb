"""The app's one source of truth: what the user chose (settings), what the worker says
(events), and the commands in between. The tray and every view listen to its signals and
call its methods; none of them talks to the worker or the disk directly."""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field, replace
from typing import Any

from msgspec import structs
from PySide6.QtCore import QObject, Signal

from app import autostart
from app.backbone_calls import BackboneCalls
from app.manager import WorkerManager
from app.settings_store import DEFAULT_PROJECT, Current, SettingsStore
from engine.credentials import Login
from engine.governor.limits import Limits
from engine.governor.policy import GovernorState
from engine.peer.events import EpochCompleted
from engine.wire.types import StrEnum
from engine.worker import protocol as p

log = logging.getLogger(__name__)
MILESTONES = (100, 1_000, 10_000, 100_000, 1_000_000, 10_000_000)


class TrayKind(StrEnum):
    """Which icon the tray shows (resources/icons/tray-<kind>.svg)."""

    CONTRIBUTING = "contributing"
    PAUSED = "paused"
    WAITING = "waiting"
    ERROR = "error"


class AppPhase(StrEnum):
    STARTING = "starting"  # the worker has not spoken yet
    WELCOME = "welcome"  # the first run: nothing trains before the user says how
    JOINING = "joining"
    NO_PROJECT = "no_project"  # the user left every project
    GOVERNED = "governed"  # in a project: the governor's state says the rest
    RETRYING = "retrying"  # something may pass (a backbone away): the worker tries again by itself
    ERROR = "error"


@dataclass
class AppState:
    """What the tray shows: ``kind`` picks the icon, ``reason`` is the sentence."""

    kind: TrayKind = TrayKind.PAUSED
    reason: str = "Starting…"
    phase: AppPhase = AppPhase.STARTING
    governor: GovernorState | None = None  # the worker's last decision, while in a project
    project: str = ""  # the project's title, once joined
    project_id: str = ""
    backbone: str = ""  # the URL in use
    username: str | None = None
    limits: Limits = field(default_factory=Limits)

    @property
    def user_paused(self) -> bool:
        """Paused or snoozed by the user: what Resume undoes."""
        return self.governor is not None and self.governor.chosen_by_user

    @property
    def tooltip(self) -> str:
        where = f" — {self.project}" if self.project else ""
        return f"Cotrain{where}\n{self.reason}"


class Controller(QObject):
    state_changed = Signal(object)  # AppState
    stats = Signal(object)  # protocol.Stats
    epoch = Signal(object)  # engine.peer.events.EpochCompleted
    notice = Signal(str, str, str)  # title, message, kind (info, error)
    login_changed = Signal(object, str, bool)  # Login or None, where it is kept, uses a keyring
    backbones_changed = Signal()
    downloading = Signal(object)  # protocol.Downloading
    welcomed = Signal()  # the first run's choices are made: the app goes on to the dashboard

    def __init__(self, store: SettingsStore | None = None, manager: WorkerManager | None = None,
                 client: BackboneCalls | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store or SettingsStore()
        self.manager = manager or WorkerManager(parent=self)
        self.client = client or BackboneCalls(parent=self)
        self.state = AppState(limits=self.store.limits())
        self.local_url = self.store.local_url
        self.login: Login | None = None
        self.last_stats: p.Stats | None = None
        # This computer's samples/s per (backbone URL, project), as measured while in it (and
        # kept: the Projects page shows it before the next Join).
        self.measured_rates: dict[tuple[str, str], float] = self.store.rates()
        self._worker_state: p.GovernorDecided | None = None
        self._error = ""
        self._retrying = ""  # what the worker waits out, saying when it tries again
        self.hosting_problem = ""  # why this computer's backbone is not running, if it is not
        self._joined = False
        self._welcoming = False
        self._milestone: int | None = None  # the highest reached, once the first stats arrive
        self.manager.received.connect(self._on_event)
        self.manager.crashed.connect(self._on_crash)
        self.manager.restarted.connect(
            lambda: self.notice.emit("Cotrain", "The worker is running again.", "info"))

    # --- life ---------------------------------------------------------------------------

    def start(self) -> None:
        self.manager.start()
        self.manager.send(p.SetLimits(limits=self.store.limits()))
        if self.store.paused:
            self.manager.send(p.Pause())
        current = self.store.current()
        if self.store.first_run:
            self._welcoming = True
            self._set(kind=TrayKind.PAUSED, reason="Choose how Cotrain may use this computer, then start",
                      phase=AppPhase.WELCOME)
        elif current is not None:
            self.join(current)
        else:
            self._set(reason="Not contributing to any project: choose one in Projects",
                      phase=AppPhase.NO_PROJECT)

    def begin(self, limits: Limits) -> None:
        """The first run's choices: these limits, and demo-lm on this computer."""
        self._welcoming = False
        self.set_limits(limits)
        self.join(Current(p.LOCAL_BACKBONE, DEFAULT_PROJECT))
        self.welcomed.emit()

    def quit(self) -> None:
        self.manager.stop()

    # --- where -------------------------------------------------------------------------

    @property
    def backbone_url(self) -> str:
        current = self.store.current()
        if current is None:
            return ""
        return self.url_of(current.backbone)

    def url_of(self, backbone: str) -> str:
        return self.local_url if backbone == p.LOCAL_BACKBONE else backbone

    def join(self, current: Current) -> None:
        """Contribute to ``current`` from now on (the worker leaves the previous project)."""
        self.store.set_current(current)
        self._joined, self._error = False, ""
        self._set(reason="Joining…", phase=AppPhase.JOINING, project="", project_id=current.project,
                  backbone=self.url_of(current.backbone))
        url = self.url_of(current.backbone)

        def send(login: Login | None) -> None:
            if self.store.current() != current:
                return  # the user chose another project meanwhile
            self.login = login
            self.manager.send(p.Start(backbone=current.backbone, project=current.project,
                                      token=login.token if login else None, name=socket.gethostname()))

        if url:
            self.client.load_login(url, lambda found: send(found[0]), lambda message: send(None))
        else:
            send(None)

    def leave(self) -> None:
        self.store.set_current(None)
        self.manager.send(p.Leave())
        self._joined = False
        self._set(reason="Not contributing to any project: choose one in Projects",
                  phase=AppPhase.NO_PROJECT, project="", project_id="")

    def refresh_login(self) -> None:
        url = self.backbone_url
        if not url:
            return
        self.client.load_login(url, lambda found: self._login_loaded(url, *found))

    def _login_loaded(self, url: str, login: Login | None, where: str, keyring: bool) -> None:
        if url == self.backbone_url:
            self.login = login
            self.login_changed.emit(login, where, keyring)

    def logged_in(self, login: Login | None) -> None:
        """After register, log in or log out: contribute under the new identity."""
        self.login = login
        current = self.store.current()
        if current is not None:
            self.join(current)
        self.refresh_login()

    def add_backbone(self, url: str) -> None:
        self.store.add_backbone(url)
        self.backbones_changed.emit()

    def remove_backbone(self, url: str) -> None:
        self.store.remove_backbone(url)
        self.backbones_changed.emit()

    # --- what the user wants -----------------------------------------------------------------

    def contribute_now(self) -> None:
        self.store.paused = False
        self.manager.send(p.RunNow())

    def pause(self) -> None:
        self.store.paused = True
        self.manager.send(p.Pause())

    def resume(self) -> None:
        self.store.paused = False
        self.manager.send(p.Resume())

    def snooze(self, seconds: float) -> None:
        self.store.paused = False
        self.manager.send(p.Snooze(until=time.time() + seconds))

    def set_limits(self, limits: Limits) -> None:
        self.store.set_limits(limits)
        self.manager.send(p.SetLimits(limits=limits))

    def set_only_when_idle(self, enabled: bool) -> None:
        self.set_limits(structs.replace(self.store.limits(), only_when_idle=enabled))

    def set_start_at_login(self, enabled: bool) -> None:
        self.store.start_at_login = enabled
        self.client.submit(lambda: autostart.set_enabled(enabled), lambda _: None,
                           lambda message: self.notice.emit("Start at login", message, "error"))

    # --- what the worker says --------------------------------------------------------------

    def _on_event(self, event: p.WorkerEvent) -> None:
        if isinstance(event, p.GovernorDecided):
            self._worker_state = event
            self.state.limits = event.limits
            self._refresh()
        elif isinstance(event, p.Stats):
            self.last_stats = event
            if event.samples_per_second > 0 and self.state.project_id:
                key = (self.state.backbone, self.state.project_id)
                self.measured_rates[key] = event.samples_per_second
                self.store.keep_rate(*key, event.samples_per_second)
            self.stats.emit(event)
            self._milestones(event.my_samples_total)
        elif isinstance(event, EpochCompleted):
            self.epoch.emit(event)
        elif isinstance(event, p.Downloading):
            self.downloading.emit(event)
        elif isinstance(event, p.Hosting):
            self.hosting_problem = ""
            self.local_url = event.url
            self.store.local_url = event.url
            current = self.store.current()
            if current is not None and current.backbone == p.LOCAL_BACKBONE:
                self._set(backbone=event.url)
                self.refresh_login()
        elif isinstance(event, p.ProjectJoined):
            self._joined, self._error, self._retrying = True, "", ""
            self._set(project=event.title, project_id=event.project, backbone=event.backbone,
                      username=event.username)
            self._refresh()
            who = f" as {event.username}" if event.username else ""
            self.notice.emit("Cotrain", f"Joined {event.title}{who}.", "info")
        elif isinstance(event, p.ProjectLeft):
            self._joined = False
            if self.store.current() is None:
                self._refresh()
        elif isinstance(event, p.ConnectionChanged):
            self._retrying = "" if event.connected else event.message
            self._refresh()
        elif isinstance(event, p.Problem):
            if event.hosting:
                self.hosting_problem = event.message
                self.backbones_changed.emit()
            if event.fatal:
                self._error = event.message
                self._refresh()
            elif event.retry_in is not None:
                first = not self._retrying
                self._retrying = event.message
                self._refresh()
                if not first:
                    return  # said once; the state shows the rest
            self.notice.emit("Cotrain: a problem", event.message, "error" if event.fatal else "info")

    def _on_crash(self, message: str, delay: int) -> None:
        self._error = message
        self._joined = False
        self._refresh()
        self.notice.emit("Cotrain: the worker stopped", message, "error")

    def _refresh(self) -> None:
        """Derive the tray's state from the worker's last word and what we know."""
        if self._welcoming:
            return
        if self._error:
            self._set(kind=TrayKind.ERROR, reason=self._error, phase=AppPhase.ERROR, governor=None)
        elif self._retrying and self.store.current() is not None:
            self._set(kind=TrayKind.ERROR, reason=self._retrying, phase=AppPhase.RETRYING)
        elif self.store.current() is None:
            self._set(kind=TrayKind.PAUSED, reason="Not contributing to any project: choose one in Projects",
                      phase=AppPhase.NO_PROJECT, governor=None)
        elif self._worker_state is None or not self._joined:
            self._set(kind=TrayKind.PAUSED, reason="Joining…" if self._worker_state else "Starting…",
                      phase=AppPhase.JOINING, governor=None)
        else:
            s = self._worker_state
            kind = TrayKind.CONTRIBUTING if s.running else TrayKind.WAITING if s.state.waiting \
                else TrayKind.PAUSED
            self._set(kind=kind, reason=s.reason, phase=AppPhase.GOVERNED, governor=s.state)

    def _set(self, **changes: Any) -> None:
        self.state = replace(self.state, **changes)
        self.state_changed.emit(self.state)

    def _milestones(self, total: int) -> None:
        best = max((m for m in MILESTONES if total >= m), default=0)
        if self._milestone is not None and best > self._milestone:
            self.notice.emit("Cotrain: a milestone",
                             f"This computer has now contributed {best:,} samples. Thank you!", "info")
        self._milestone = best
