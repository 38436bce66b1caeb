"""Supervises the worker child process (``cotrain worker``) with QProcess.

The GUI only ever writes commands and reads event lines as they arrive (both non-blocking).
A worker that dies unexpectedly is restarted after a growing pause (1 s, 2 s, 4 s ... 60 s;
back to 1 s once it has run for a minute) and told again what it was doing: the last
limits, the pause/snooze/contribute-now choice and the project. The user is told each time.
What the worker writes to stderr goes to worker.log, which rotates: a worker left running
for weeks keeps a few megabytes of log, not gigabytes.
"""

from __future__ import annotations

import logging
import time
import weakref
from logging.handlers import RotatingFileHandler
from pathlib import Path

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Qt, QTimer, Signal

from engine.paths import engine_command, user_data_dir
from engine.wire import ProtocolError
from engine.worker import protocol as p

log = logging.getLogger(__name__)
BACKOFF = (1, 2, 4, 8, 16, 30, 60)
HEALTHY_AFTER = 60.0
STOP_GRACE_MS = 15_000
LOG_BYTES = 5 * 1024 * 1024  # per file
LOG_BACKUPS = 3  # worker.log.1 .. worker.log.3


class WorkerLog:
    """The worker's stderr, line by line, into a log file that rotates at ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int = LOG_BYTES, backups: int = LOG_BACKUPS) -> None:
        self.path = path
        self._handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8",
                                            delay=True)
        self._pending = b""

    def write(self, data: bytes) -> None:
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            self._line(line)

    def flush(self) -> None:
        """The rest of an unfinished line (the worker has exited)."""
        if self._pending:
            self._line(self._pending)
            self._pending = b""

    def _line(self, line: bytes) -> None:
        self._handler.handle(logging.makeLogRecord({"msg": line.decode("utf-8", "replace").rstrip("\r")}))

    def close(self) -> None:
        self.flush()
        self._handler.close()


class WorkerManager(QObject):
    received = Signal(object)  # an event the worker sent
    crashed = Signal(str, int)  # what happened, seconds until the restart
    restarted = Signal()  # a restarted worker said hello
    stopped = Signal()  # the worker exited after stop()

    def __init__(self, command: list[str] | None = None, log_path: Path | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.command = command or [*engine_command(), "worker", "-v"]
        self.log_path = log_path or user_data_dir() / "worker.log"
        self.log: WorkerLog | None = None
        self.process: QProcess | None = None
        self.pid = 0
        self._replay: dict[str, p.Command] = {}
        self._stopping = False
        self._failures = 0
        self._started_at = 0.0
        self._crashed = False
        self._restart = QTimer(self, singleShot=True, timerType=Qt.TimerType.PreciseTimer)  # never early
        self._restart.timeout.connect(self._spawn)
        self._kill = QTimer(self, singleShot=True, interval=STOP_GRACE_MS)
        self._kill.timeout.connect(self._force_kill)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.state() != QProcess.ProcessState.NotRunning

    def start(self) -> None:
        self._stopping = False
        self._spawn()

    def send(self, command: p.Command) -> None:
        """Send now if the worker is up; remember it so a restarted worker gets it too."""
        kind = {p.SetLimits: "limits", p.Start: "project", p.Leave: "project"}.get(type(command), "mode")
        self._replay[kind] = command
        self._write(command)

    def stop(self) -> None:
        """Ask the worker to leave and exit; kill it if it has not after STOP_GRACE_MS."""
        self._stopping = True
        self._restart.stop()
        if not self.running:
            self.stopped.emit()
            return
        self._write(p.Stop())
        # A worker still starting (no hello yet) has not been written to: end of input stops
        # it just the same, as soon as it reads its first line.
        if self.process is not None:
            self.process.closeWriteChannel()
        self._kill.start()

    def _write(self, command: p.Command) -> None:
        if self.process is not None and self.running and self.pid:
            self.process.write(p.encode_line(command))

    def _spawn(self) -> None:
        if self.log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = WorkerLog(self.log_path)
        process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONUNBUFFERED", "1")
        process.setProcessEnvironment(env)
        # The process's connections must not keep its manager alive: when a finished process
        # is deleted last, dropping the manager with it would delete the process twice.
        manager = weakref.proxy(self)
        process.readyReadStandardOutput.connect(lambda: manager._read(process))
        process.readyReadStandardError.connect(lambda: manager._log(process))
        process.finished.connect(lambda code, status: manager._finished(process, code, status))
        process.errorOccurred.connect(lambda error: manager._error(process, error))
        self.process, self.pid = process, 0
        self._started_at = time.monotonic()
        process.start(self.command[0], self.command[1:])

    def _read(self, process: QProcess) -> None:
        while process.canReadLine():
            line = bytes(process.readLine().data())
            try:
                event = p.events.decode(line)
            except ProtocolError as exc:
                log.warning("unreadable line from the worker (%s): %r", exc, line[:200])
                continue
            if isinstance(event, p.Hello):
                self._hello(event)
            self.received.emit(event)

    def _log(self, process: QProcess) -> None:
        if self.log is not None:
            self.log.write(bytes(process.readAllStandardError().data()))

    def _hello(self, hello: p.Hello) -> None:
        self.pid = hello.pid
        if hello.version != p.VERSION:
            self.received.emit(p.Problem(
                message=f"the worker speaks protocol v{hello.version} and the app v{p.VERSION}: this "
                        "installation of Cotrain is broken; please install it again", fatal=True))
            self.stop()
            return
        if self._stopping:
            return  # quit before it was up: nothing to start
        for kind in ("limits", "mode", "project"):
            command = self._replay.get(kind)
            if command is not None:
                self._write(command)
        if self._crashed:
            self._crashed = False
            self.restarted.emit()

    def _error(self, process: QProcess, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart and process is self.process:
            self._crash(f"the worker could not be started ({process.errorString()})")

    def _finished(self, process: QProcess, code: int, status: QProcess.ExitStatus) -> None:
        if process is not self.process:
            return
        self._log(process)
        if self.log is not None:
            self.log.flush()
        self._kill.stop()
        process.deleteLater()
        self.process, self.pid = None, 0
        if self._stopping:
            self.stopped.emit()
            return
        how = f"exit status {code}" if status == QProcess.ExitStatus.NormalExit else "it crashed"
        self._crash(f"the worker stopped unexpectedly ({how})")

    def _crash(self, what: str) -> None:
        if time.monotonic() - self._started_at > HEALTHY_AFTER:
            self._failures = 0
        delay = BACKOFF[min(self._failures, len(BACKOFF) - 1)]
        self._failures += 1
        self._crashed = True
        log.warning("%s; restarting in %d s (log: %s)", what, delay, self.log_path)
        self.crashed.emit(f"{what}; restarting in {delay} s. Details are in {self.log_path}", delay)
        self._restart.start(delay * 1000)

    def _force_kill(self) -> None:
        if self.process is not None:
            log.warning("the worker did not stop in time; killing it")
            self.process.kill()
