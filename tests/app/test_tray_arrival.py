"""A tray that comes up after the app (the desktop's panel at login, or started later): the
icon docks when it appears. Started at login, the app waits for a tray before opening its
window as the app; started by hand without a tray, it opens the window at once."""

from __future__ import annotations

import sys

import pytest

from app import application
from app.application import CotrainApp
from app.controller import Controller
from app.manager import WorkerManager
from app.settings_store import Current, SettingsStore
from tests.app.conftest import stop_manager, wait_until

pytestmark = pytest.mark.timeout(60)


class Tray:
    """Whether a tray host is there, as the desktop would answer."""

    def __init__(self) -> None:
        self.up = False

    def __call__(self) -> bool:
        return self.up


@pytest.fixture
def app_without_tray(qtbot, home, monkeypatch, tmp_path):
    monkeypatch.setattr(application, "TRAY_WAIT_MS", 1_000)
    monkeypatch.setattr(application, "TRAY_LOOK_LATER_MS", 200)
    store = SettingsStore()
    store.set_current(Current("local", "demo-lm"))  # not the first run: start in the tray
    idle_worker = [sys.executable, "-c", "import sys; sys.stdin.read()"]  # this test needs no engine
    tray = Tray()
    made = []

    def make(background: bool) -> CotrainApp:
        controller = Controller(store=store, manager=WorkerManager(idle_worker, tmp_path / "worker.log"))
        app = CotrainApp(controller, single_instance=False, background=background, tray_available=tray)
        made.append(app)
        app.start()
        return app

    yield make, tray
    for app in made:
        stop_manager(app.controller.manager)
        app.window.hide()
        if app.tray is not None:
            app.tray.hide()


def test_started_at_login_it_waits_for_the_tray_and_docks_there(app_without_tray):
    make, tray = app_without_tray
    app = make(background=True)
    assert not app.window.isVisible() and not app.has_tray
    tray.up = True
    wait_until(lambda: app.has_tray, 5, "the icon to dock")
    assert app.tray is not None and app.tray.isVisible() and not app.window.isVisible()
    assert app.window.has_tray  # closing the window now hides it to the tray


def test_without_a_tray_the_window_is_the_app_and_the_icon_docks_once_one_comes(app_without_tray):
    make, tray = app_without_tray
    app = make(background=True)
    wait_until(app.window.isVisible, 5, "the window, after waiting for a tray in vain")
    assert not app.has_tray and not app.window.has_tray
    tray.up = True
    wait_until(lambda: app.has_tray, 5, "the icon to dock when the tray comes up")
    assert app.window.isVisible() and app.window.has_tray


def test_started_by_hand_without_a_tray_the_window_opens_at_once(app_without_tray):
    make, _ = app_without_tray
    app = make(background=False)
    assert app.window.isVisible() and not app.has_tray
