"""One Cotrain per user: the first instance listens on a local socket (QLocalServer); a
second one connects, asks the first to show its window, and exits."""

from __future__ import annotations

import getpass
import hashlib
import weakref

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from engine.paths import user_data_dir

CONNECT_MS = 500


def server_name() -> str:
    """Per user and per data folder, so a test with its own COTRAIN_HOME is its own user."""
    folder = hashlib.sha256(str(user_data_dir()).encode()).hexdigest()[:12]
    return f"cotrain-{getpass.getuser()}-{folder}"


class NotAnswering(RuntimeError):
    """Another Cotrain holds the socket but does not take messages."""


def ask_running_instance(message: str = "show", attempts: int = 10) -> bool:
    """True if another instance took ``message``: this one should exit.

    The one short wait in the app, before any window exists. Where nothing listens (no
    socket, or one a crashed instance left behind) connecting fails at once; an instance
    that is merely busy gets a few seconds, and is never taken for a crashed one."""
    for _ in range(attempts):
        socket = QLocalSocket()
        socket.connectToServer(server_name())
        if socket.waitForConnected(CONNECT_MS):
            socket.write(message.encode() + b"\n")
            socket.flush()
            socket.waitForBytesWritten(CONNECT_MS)
            socket.disconnectFromServer()
            return True
        if socket.error() != QLocalSocket.LocalSocketError.SocketTimeoutError:
            return False
    raise NotAnswering("Cotrain is already running but does not answer; "
                       "end it (or restart your session) and try again")


class InstanceServer(QObject):
    message = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        name = server_name()
        if not self.server.listen(name):
            # Nobody answered on it (ask_running_instance): left over from a crashed instance.
            QLocalServer.removeServer(name)
            if not self.server.listen(name):
                raise OSError(f"cannot listen on {name}: {self.server.errorString()}")
        self.server.newConnection.connect(self._accept)

    def _accept(self) -> None:
        guard = weakref.proxy(self)  # a socket deleted last must not drop its server's owner
        while (socket := self.server.nextPendingConnection()) is not None:
            socket.readyRead.connect(lambda s=socket, g=guard: g._read(s))
            socket.disconnected.connect(socket.deleteLater)

    def _read(self, socket: QLocalSocket) -> None:
        while socket.canReadLine():
            self.message.emit(bytes(socket.readLine().data()).decode(errors="replace").strip())
