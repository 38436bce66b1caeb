"""The embedded default: a user with nothing configured is asked how Cotrain may use the
computer (one screen), then gets a local backbone hosting demo-lm and trains it — in the app
(numbers move on the dashboard) and, with no display, in the terminal (with the same
defaults: half the processor cores)."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest
from PySide6.QtCore import QSettings

from app.application import CotrainApp
from app.settings_store import SettingsStore
from engine.governor.limits import Limits, default_limits
from engine.paths import engine_command
from tests.app.conftest import WORKER_START, stop_app, wait_until
from tests.app.test_xvfb import ARTIFACTS

pytestmark = pytest.mark.timeout(120)


def fresh_user(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("COTRAIN_HOME", "XDG_DATA_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the machine is shared; not a Cotrain setting


def tile(app, name: str) -> int:
    text = app.window.pages["dashboard"].tiles[name].text().replace(",", "")
    return int(text) if text.isdigit() else -1


def test_first_run_hosts_demo_lm_and_trains_it(qtbot, monkeypatch, tmp_path):
    fresh_user(monkeypatch, tmp_path)
    app = CotrainApp(tray=False)
    assert app.controller.store.first_run
    notices = []
    app.controller.notice.connect(lambda title, text, kind: notices.append(text))
    app.start()
    try:
        # The first run opens its one screen, and nothing trains before Start.
        assert app.window.isVisible() and app.window.current_page == "welcome"
        welcome = app.window.welcome
        assert welcome.cores.value() == default_limits().threads and welcome.always.isChecked()
        wait_until(lambda: app.controller.state.limits == default_limits(), WORKER_START, "the worker")
        assert app.controller.state.phase == "welcome" and "project" not in app.controller.manager._replay
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        assert app.window.grab().save(str(ARTIFACTS / "first-run.png"))
        welcome.start_button.click()
        assert app.window.current_page == "dashboard"
        assert app.controller.store.limits().threads == default_limits().threads
        dashboard = app.window.pages["dashboard"]
        wait_until(lambda: tile(app, "session") > 0, WORKER_START, "my first samples")
        first = tile(app, "session")
        wait_until(lambda: tile(app, "session") > first, 30, "more samples")
        state = app.controller.state
        assert state.kind == "contributing" and state.project == "Demo language model"
        assert state.backbone.startswith("http://127.0.0.1:")
        assert "Demo language model at http://127.0.0.1:" in dashboard.project.text()
        assert "of 128 samples gathered by 1 peer" in dashboard.progress_text.text()
        assert (tmp_path / ".local" / "share" / "cotrain" / "local-backbone" / "backbone.sqlite3").exists()
        assert "Joined Demo language model." in notices
        # The first milestone is told (here, without a tray, in the window's status bar).
        milestone = "This computer has now contributed 100 samples. Thank you!"
        wait_until(lambda: milestone in notices, 60, lambda: f"the first milestone; told {notices}")
        assert app.window.statusBar().currentMessage() == milestone
    finally:
        stop_app(app)


async def run_headless(home, until, timeout: float = 60) -> tuple[list[str], int]:
    """``cotrain`` with no display, as a user at a terminal starts it; stderr lines until
    ``until(lines)`` holds, then Ctrl-C; returns the lines and the exit status."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "COTRAIN_HOME", "XDG_DATA_HOME")}
    env.update(HOME=str(home), OMP_NUM_THREADS="1")
    process = await asyncio.create_subprocess_exec(
        *engine_command(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=env)
    assert process.stderr is not None
    lines: list[str] = []
    try:
        while not until(lines):
            raw = await asyncio.wait_for(process.stderr.readline(), timeout)
            assert raw, f"cotrain exited early: {lines[-5:]}"
            lines.append(raw.decode(errors="replace").strip())
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 30)
    return lines, code


def session_counts(lines: list[str]) -> list[int]:
    return [int(m.group(1).replace(",", "")) for m in (re.search(r"([\d,]+) this session", line)
                                                      for line in lines) if m]


async def test_without_a_display_cotrain_trains_in_the_terminal(tmp_path):
    lines, code = await run_headless(
        tmp_path, lambda lines: len(set(session_counts(lines))) >= 2 and max(session_counts(lines)) > 0)
    text = "\n".join(lines)
    counts = session_counts(lines)
    assert "No display: contributing from the terminal" in text
    assert f"limits from the app's Settings: {default_limits().describe()}" in text
    assert "hosting the local backbone on this computer at http://127.0.0.1:" in text
    assert "joined 'Demo language model'" in text
    assert counts == sorted(counts) and counts[-1] > 0
    assert code == 0


async def test_the_terminal_keeps_the_limits_set_in_the_app(tmp_path):
    settings = QSettings(str(tmp_path / ".local" / "share" / "cotrain" / "settings.ini"),
                         QSettings.Format.IniFormat)
    SettingsStore(settings).set_limits(Limits(threads=1, cpu_percent=40, only_when_idle=True))
    settings.sync()
    lines, code = await run_headless(tmp_path, lambda lines: any("paused:" in line for line in lines))
    text = "\n".join(lines)
    assert "limits from the app's Settings: 1 threads, 40% of the time, only after 5 idle minutes" in text
    # No display, so no idle time to read: the worker waits rather than compute while in use.
    assert "paused: " in text and "idle" in text.split("paused: ", 1)[1].lower()
    assert not session_counts(lines) or max(session_counts(lines)) == 0
    assert code == 0
