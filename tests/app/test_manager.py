"""The worker's supervisor on its own: quitting at any moment, and restarts that back off."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from PySide6.QtCore import QProcess

from app.manager import STOP_GRACE_MS, WorkerLog, WorkerManager
from engine.worker import protocol as p
from tests.app.conftest import stop_manager, wait_until


def test_quitting_while_the_worker_starts_ends_it_cleanly_without_starting_a_project(qtbot, home, tmp_path):
    manager = WorkerManager(log_path=tmp_path / "worker.log")
    events, stopped = [], []
    manager.received.connect(events.append)
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
    assert not [e for e in events if isinstance(e, (p.Hosting, p.ProjectJoined))]
    log = tmp_path / "worker.log"
    assert not log.exists() or "Traceback" not in log.read_text()


def test_a_worker_that_keeps_dying_is_restarted_after_growing_pauses(qtbot, home, tmp_path):
    manager = WorkerManager(command=[sys.executable, "-c", "raise SystemExit(3)"],
                            log_path=tmp_path / "worker.log")
    crashes = []
    manager.crashed.connect(lambda what, delay: crashes.append((what, delay, time.monotonic())))
    manager.start()
    try:
        wait_until(lambda: len(crashes) >= 3, 20, "three crashes")
    finally:
        stop_manager(manager)
    assert [delay for _, delay, _ in crashes[:3]] == [1, 2, 4]
    assert all("exit status 3" in what and "restarting in" in what for what, _, _ in crashes)
    # Each restart waited its pause before starting again.
    assert crashes[1][2] - crashes[0][2] >= 0.99 and crashes[2][2] - crashes[1][2] >= 1.99


def test_the_worker_log_rotates_and_keeps_a_few_files(tmp_path):
    path = tmp_path / "worker.log"
    log = WorkerLog(path, max_bytes=1000, backups=2)
    lines = [f"line {i:04d} of a worker that talks a lot".encode() for i in range(400)]
    stream = b"\n".join(lines) + b"\nand an unfinished li"
    for start in range(0, len(stream), 333):  # pipes deliver arbitrary pieces, lines split
        log.write(stream[start:start + 333])
    log.close()
    kept = sorted(tmp_path.iterdir())
    assert [p.name for p in kept] == ["worker.log", "worker.log.1", "worker.log.2"]
    assert all(p.stat().st_size <= 1000 for p in kept)
    newest = path.read_text().splitlines()
    assert newest[-2:] == [lines[-1].decode(), "and an unfinished li"]
    assert (tmp_path / "worker.log.1").read_text().splitlines()[-1] == \
        lines[-1 - len(newest) + 1].decode()  # nothing lost between two files


def test_a_worker_of_another_protocol_version_is_refused(qtbot, home, tmp_path):
    hello = p.encode_line(p.Hello(version=p.VERSION + 1, pid=1)).decode()
    script = f"import sys, time; sys.stdout.write({hello!r}); sys.stdout.flush(); sys.stdin.read()"
    manager = WorkerManager(command=[sys.executable, "-c", script], log_path=tmp_path / "worker.log")
    events, stopped = [], []
    manager.received.connect(events.append)
    manager.stopped.connect(lambda: stopped.append(True))
    manager.start()
    manager.send(p.Start("local", "demo-lm", None, "me"))
    wait_until(lambda: stopped, 20, "the mismatched worker to be stopped")
    problems = [e for e in events if isinstance(e, p.Problem)]
    assert problems and problems[0].fatal and "install it again" in problems[0].message


DROPPED_MANAGER = """
import os
import subprocess
import sys
from pathlib import Path
from PySide6.QtCore import QCoreApplication, QEvent, QEventLoop
from PySide6.QtWidgets import QApplication
from app.manager import WorkerManager

app = QApplication([])

def supervise_one_crash():
    manager = WorkerManager(command=[sys.executable, "-c", "raise SystemExit(3)"], log_path=Path(sys.argv[1]))
    loop = QEventLoop()
    manager.crashed.connect(lambda what, delay: loop.quit())
    manager.start()
    loop.exec()  # left inside the crash signal: the finished process is still to be deleted
    manager.stop()

supervise_one_crash()
QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
print("still running")
"""


def test_a_manager_dropped_before_its_finished_worker_is_deleted_does_not_crash(tmp_path):
    """The finished QProcess held the manager's last reference: deleting it deleted the manager,
    which deleted the process again (a segfault in CI, after the test that drops a manager)."""
    child = subprocess.run([sys.executable, "-c", DROPPED_MANAGER, str(tmp_path / "worker.log")],
                           capture_output=True, text=True, timeout=60,
                           env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert child.returncode == 0, child.stderr[-2000:]
    assert child.stdout.strip() == "still running"
