"""Fixtures for the desktop app: Qt offscreen, a private home per test, an in-memory keyring,
a real backbone on loopback (in its own thread and event loop, since Qt owns this thread),
and the app itself with its real worker process."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import keyring
import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from engine.backbone.server import Backbone, BackboneConfig
from engine.governor.limits import Limits
from engine.project import ProjectSpec
from tests.collab.harness import tiny_project
from tests.unit.test_credentials import memory_keyring

WORKER_START = 60.0  # seconds: a cold worker imports torch and builds its model
DEFAULT_TIMEOUT = 300  # (pyproject.toml's)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Inside Qt's event loop pytest-timeout's alarm never runs (a window whose exec() never
    returned held CI for 85 minutes): the app's tests time out from a thread instead, which
    prints every thread's stack and ends the process (xdist names the test and goes on)."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            marker = item.get_closest_marker("timeout")
            seconds = marker.args[0] if marker is not None and marker.args else DEFAULT_TIMEOUT
            item.add_marker(pytest.mark.timeout(seconds, method="thread"))
TEST_LIMITS = Limits(threads=1, low_priority=False)


@dataclass
class ThreadedBackbone:
    backbone: Backbone
    loop: asyncio.AbstractEventLoop
    url: str

    def call(self, coro, timeout: float = 30):
        """Run ``coro`` on the backbone's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextmanager
def threaded_backbone(data_dir: Path, *projects: ProjectSpec) -> Iterator[ThreadedBackbone]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="test-backbone", daemon=True)
    thread.start()
    backbone = Backbone(BackboneConfig(data_dir=data_dir), list(projects))
    running = ThreadedBackbone(backbone, loop, "")
    try:
        running.url = running.call(backbone.start())
        yield running
    finally:
        running.call(backbone.stop())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def private_home(monkeypatch, root: Path) -> Path:
    """A fresh user: data, settings, autostart entries and the single-instance name all move."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("COTRAIN_HOME", str(home / "cotrain"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    return home


@pytest.fixture
def home(monkeypatch, tmp_path) -> Path:
    return private_home(monkeypatch, tmp_path)


@contextmanager
def keyring_backend(backend) -> Iterator:
    previous = keyring.get_keyring()
    keyring.set_keyring(backend)
    try:
        yield backend
    finally:
        keyring.set_keyring(previous)


@pytest.fixture
def memory_keys():
    with keyring_backend(memory_keyring()) as backend:
        yield backend


def tiny() -> ProjectSpec:
    return tiny_project(target_batch_size=64, checkpoint_every=1000)


def stop_manager(manager) -> None:
    """Stop a worker manager and wait (bounded) until its process has ended: Qt must not
    destroy a QProcess whose signals still reach the manager."""
    stopped: list[bool] = []
    manager.stopped.connect(lambda: stopped.append(True))
    manager.stop()
    wait_until(lambda: stopped, 30, "the worker to stop")


def stop_app(app) -> None:
    """Quit as the user does, and wait (bounded) for the worker to leave and exit."""
    manager = app.controller.manager
    stopped: list[bool] = []
    manager.stopped.connect(lambda: stopped.append(True))
    app.controller.quit()
    wait_until(lambda: stopped, 30, "the worker to stop")
    app.window.hide()
    if app.tray is not None:
        app.tray.hide()
    if app.instance is not None:
        app.instance.server.close()


def wait_until(condition, timeout: float, what: str | Callable[[], str] = "") -> None:
    """Run the Qt event loop until ``condition()`` holds (an AssertionError counts as not yet),
    failing after ``timeout`` seconds with ``what`` (or what it returns) in the message.

    Not qtbot.waitUntil: in PySide6 6.12.0 the static ``QCoreApplication.processEvents`` and
    ``QTest.qWait`` drop a reference to None on every call, and a few thousand polls abort
    the interpreter ("none_dealloc"). A QEventLoop woken by a timer does not."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    timer = QTimer(interval=20)
    timer.timeout.connect(loop.quit)
    deadline = time.monotonic() + timeout
    timer.start()
    try:
        while True:
            try:
                if condition():
                    return
            except AssertionError:
                pass
            if time.monotonic() > deadline:
                described = what() if callable(what) else what
                raise AssertionError(f"timed out after {timeout}s waiting for {described or condition}")
            loop.exec()
    finally:
        timer.stop()
