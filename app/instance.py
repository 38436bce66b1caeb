"""One Cotrain per user: the first instance listens on a local socket (QLocalServer); a
second one connects, asks the first to show its window, and exits."""

from __future__ import annotations

import getpass
import hashlib

from PySide6.QtCore import QObject, Signal
from PySide6.QtNetwork import QLocalServer, QLocalSocket

from engine.paths import user_data_dir

CONNECT_MS = 500


def server_name() -> str:
    """Per user and per data folder, so a test with its own COTRAIN_HOME is its own user."""
    folder = hashlib.sha256(str(user_data_dir()).encode()).hexdigest()[:12]
    return f"cotrain-{getpass.getuser()}-{folder}"


def ask_running_instance(message: str = "show") -> bool:
    """True if another instance took ``message``: this one should exit.

    The one short wait in the app, before any window exists: connecting to a local socket
    either succeeds at once or fails at once."""
    socket = QLocalSocket()
    socket.connectToServer(server_name())
    if not socket.waitForConnected(CONNECT_MS):
        return False
    socket.write(message.encode() + b"\n")
    socket.flush()
    socket.waitForBytesWritten(CONNECT_MS)
    socket.disconnectFromServer()
    return True


class InstanceServer(QObject):
    message = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.server = QLocalServer(self)
        self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
        name = server_name()
        if not self.server.listen(name):
            QLocalServer.removeServer(name)  # left over from a crashed instance
            if not self.server.listen(name):
                raise OSError(f"cannot listen on {name}: {self.server.errorString()}")
        self.server.newConnection.connect(self._accept)

    def _accept(self) -> None:
        while (socket := self.server.nextPendingConnection()) is not None:
            socket.readyRead.connect(lambda s=socket: self._read(s))
            socket.disconnected.connect(socket.deleteLater)

    def _read(self, socket: QLocalSocket) -> None:
        while socket.canReadLine():
            self.message.emit(bytes(socket.readLine().data()).decode(errors="replace").strip())
