"""The embedded default: a user with nothing configured gets a local backbone hosting demo-lm
and trains it at once — in the app (numbers move on the dashboard) and, with no display,
in the terminal."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from app.application import CotrainApp
from engine.paths import engine_command
from tests.app.conftest import WORKER_START, stop_app, wait_until

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
    app.start()
    try:
        assert app.window.isVisible()  # the first run opens the dashboard
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
    finally:
        stop_app(app)


async def test_without_a_display_cotrain_trains_in_the_terminal(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM", "COTRAIN_HOME", "XDG_DATA_HOME")}
    env.update(HOME=str(tmp_path), OMP_NUM_THREADS="1")
    process = await asyncio.create_subprocess_exec(
        *engine_command(), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE, env=env)
    assert process.stderr is not None
    lines: list[str] = []
    session_counts: list[int] = []
    try:
        while len(set(session_counts)) < 2 or max(session_counts) == 0:
            raw = await asyncio.wait_for(process.stderr.readline(), 60)
            assert raw, f"cotrain exited early: {lines[-5:]}"
            lines.append(raw.decode(errors="replace").strip())
            match = re.search(r"([\d,]+) this session", lines[-1])
            if match:
                session_counts.append(int(match.group(1).replace(",", "")))
    finally:
        process.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(process.wait(), 30)
    text = "\n".join(lines)
    assert "No display: contributing from the terminal" in text
    assert "hosting demo-lm on this computer at http://127.0.0.1:" in text
    assert "joined 'Demo language model'" in text
    assert session_counts == sorted(session_counts) and session_counts[-1] > 0
    assert code == 0
