"""The app with its real worker, against backbones that misbehave as real ones do: one that
accepts connections and never answers, one started after the app, one killed and started
again. The app says in plain words what it waits for, and recovers without the user doing
anything. (Before: the peer said "Contributing" and hung on the silent one for minutes, a
join that failed once was fatal, and raw library text reached the dashboard and the tray.)
Screenshots of the dashboard after an outage, the leaderboard of a user not logged in and the
tray menu while the backbone is down go to tests/artifacts/app/."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from app.application import CotrainApp
from app.controller import Controller
from app.settings_store import Current, SettingsStore
from engine.paths import engine_command
from tests.app.conftest import TEST_LIMITS, WORKER_START, stop_app, tiny, wait_until
from tests.app.test_xvfb import ARTIFACTS
from tests.collab.processes import write_catalog

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
RAW = ("Errno", "Connect call failed", "ssl:default", "ClientConnector", "Traceback")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BackboneProcess:
    """``cotrain backbone`` on a fixed port, as its owner runs it: it can be killed and
    started again on the same data."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port = root, port
        self.catalog = write_catalog(root / "catalog.json", tiny())
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = (self.root / "backbone.log").open("ab")
        self.process = subprocess.Popen(
            [*engine_command(), "backbone", "--port", str(self.port), "--data-dir", str(self.root / "data"),
             "--catalog", str(self.catalog)], stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
            text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("backbone listening on "), (self.root / "backbone.log").read_text()[-2000:]

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(20)


def app_joined_to(url: str) -> CotrainApp:
    store = SettingsStore()
    store.set_limits(TEST_LIMITS)
    store.set_current(Current(url, "tiny-lm"))
    app = CotrainApp(Controller(store=store), tray=True)
    app.start()
    return app


def says(app: CotrainApp, *words: str) -> bool:
    reason = app.controller.state.reason
    return all(w in reason for w in words)


def credited_here(app: CotrainApp) -> int:
    stats = app.controller.last_stats
    return stats.my_samples_total if stats is not None else 0


def plain(text: str) -> bool:
    return not any(raw in text for raw in RAW)


def test_a_backbone_that_never_answers_is_said_so_and_asked_again(qtbot, home):
    silent = socket.socket()  # the kernel accepts connections; nobody ever answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    port = silent.getsockname()[1]
    app = app_joined_to(f"http://127.0.0.1:{port}")
    try:
        wait_until(lambda: says(app, f"127.0.0.1:{port} does not answer", "Trying again in"),
                   WORKER_START + 20, lambda: f"the app to say so; it says {app.controller.state.reason!r}")
        state = app.controller.state
        assert state.kind == "error" and state.phase == "retrying" and plain(state.reason)
        dashboard = app.window.pages["dashboard"]
        assert plain(dashboard.reason.text()) and "does not answer" in dashboard.reason.text()
        assert app.tray is not None and len(app.tray.status_action.text()) <= 60
    finally:
        stop_app(app)
        silent.close()


def test_a_backbone_started_after_the_app_is_joined_without_the_user(qtbot, home, tmp_path):
    backbone = BackboneProcess(tmp_path, free_port())
    app = app_joined_to(backbone.url)
    try:
        wait_until(lambda: says(app, f"Nothing answers at 127.0.0.1:{backbone.port}", "Trying again"),
                   WORKER_START, lambda: f"the first failure; the app says {app.controller.state.reason!r}")
        assert plain(app.controller.state.reason)
        backbone.start()
        wait_until(lambda: app.controller.state.kind == "contributing", 60,
                   lambda: f"the app to join by itself; it says {app.controller.state.reason!r}")
    finally:
        stop_app(app)
        backbone.kill()


def test_a_backbone_killed_and_started_again_is_found_again_without_the_user(qtbot, home, tmp_path):
    backbone = BackboneProcess(tmp_path, free_port())
    backbone.start()
    app = app_joined_to(backbone.url)
    try:
        wait_until(lambda: app.controller.state.kind == "contributing", WORKER_START, "the app to contribute")
        backbone.kill()
        wait_until(lambda: says(app, f"Lost the backbone at 127.0.0.1:{backbone.port}"), 60,
                   lambda: f"the app to notice; it says {app.controller.state.reason!r}")
        assert app.controller.state.kind == "error" and plain(app.controller.state.reason)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert app.tray is not None
        menu = app.tray.contextMenu()
        menu.adjustSize()
        assert menu.grab().save(str(ARTIFACTS / "tray-menu-backbone-down.png"))
        backbone.start()
        wait_until(lambda: app.controller.state.kind == "contributing", 90,
                   lambda: f"the app to contribute again; it says {app.controller.state.reason!r}")
        # (A backbone that restarts waits up to a minute for the peers holding the epoch it
        # recorded before it lets anyone start over: engine/docs/accounts_and_ledger.md, Restart.)
        wait_until(lambda: credited_here(app) > 0, 90, "samples credited on this computer")
        dashboard = app.window.pages["dashboard"]
        app.window.show_page("dashboard")
        wait_until(lambda: dashboard.title.text() == "Contributing", 20, "the dashboard to say so")
        assert app.window.grab().save(str(ARTIFACTS / "dashboard-after-outage.png"))
        # Not logged in: this computer's own line on the leaderboard.
        board = app.window.pages["leaderboard"]
        app.window.show_page("leaderboard")
        def mine() -> tuple[str, str]:
            last = board.table.rowCount() - 1
            cells = [board.table.item(last, column) for column in (1, 2)] if last >= 0 else [None, None]
            return (cells[0].text(), cells[1].text()) if all(cells) else ("", "")

        wait_until(lambda: mine()[0] == "This computer (not logged in)" and mine()[1] not in ("", "0"), 30,
                   lambda: f"this computer's line, with its samples; it shows {mine()}")
        assert app.window.grab().save(str(ARTIFACTS / "leaderboard-anonymous.png"))
    finally:
        stop_app(app)
        backbone.kill()
