"""The worker's supervisor on its own: quitting at any moment, and restarts that back off."""

from __future__ import annotations

import sys
import time

from PySide6.QtCore import QProcess

from app.manager import STOP_GRACE_MS, WorkerManager
from engine.worker import protocol as p
from tests.app.conftest import wait_until


def test_quitting_while_the_worker_starts_ends_it_cleanly_without_starting_a_project(qtbot, home, tmp_path):
    manager = WorkerManager(log_path=tmp_path / "worker.log")
    events, stopped = [], []
    manager.event.connect(events.append)
    manager.stopped.connect(lambda: stopped.append(time.monotonic()))
    manager.start()
    manager.send(p.Start("local", "demo-lm", None, "me"))  # what the app does at once
    exits = []
    manager.process.finished.connect(lambda code, status: exits.append((code, status)))
    began = time.monotonic()
    manager.stop()  # the user quits before the worker said hello
    wait_until(lambda: stopped, STOP_GRACE_MS / 1000 + 5, "the worker to stop")
    assert stopped[0] - began < STOP_GRACE_MS / 1000, "it was killed, not stopped"
    assert exits == [(0, QProcess.ExitStatus.NormalExit)]
    assert not [e for e in events if isinstance(e, (p.Hosting, p.Joined))]
    assert "did not stop in time" not in (tmp_path / "worker.log").read_text()


def test_a_worker_that_keeps_dying_is_restarted_after_growing_pauses(qtbot, home, tmp_path):
    manager = WorkerManager(command=[sys.executable, "-c", "raise SystemExit(3)"],
                            log_path=tmp_path / "worker.log")
    crashes = []
    manager.crashed.connect(lambda what, delay: crashes.append((what, delay, time.monotonic())))
    manager.start()
    try:
        wait_until(lambda: len(crashes) >= 3, 20, "three crashes")
    finally:
        manager.stop()
    assert [delay for _, delay, _ in crashes[:3]] == [1, 2, 4]
    assert all("exit status 3" in what and "restarting in" in what for what, _, _ in crashes)
    # Each restart waited its pause before starting again.
    assert crashes[1][2] - crashes[0][2] >= 0.99 and crashes[2][2] - crashes[1][2] >= 1.99
