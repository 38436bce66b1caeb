"""A private D-Bus daemon, and services on it that answer like a desktop's idle monitors.

The desktop services themselves (GNOME Shell, KDE's screensaver, logind) cannot run on a
machine without a session; these answer the same methods on a real bus, so the engine's
D-Bus clients are exercised end to end: connection, method call, reply, decoding.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator

from jeepney import MessageType, new_error, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

Reply = Callable[[tuple], tuple[str, tuple]]  # call body -> (signature, body)


@contextlib.contextmanager
def private_bus() -> Iterator[str]:
    """A dbus-daemon of our own; yields its address."""
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        import pytest

        pytest.skip("dbus-daemon is not installed (apt-get install dbus-daemon)")
    with tempfile.TemporaryDirectory() as tmp:
        process = subprocess.Popen(
            [daemon, "--session", "--nofork", "--print-address=1", f"--address=unix:dir={tmp}"],
            stdout=subprocess.PIPE, text=True,
        )
        try:
            address = process.stdout.readline().strip()
            assert address.startswith("unix:"), address
            yield address
        finally:
            process.terminate()
            process.wait(10)


@contextlib.contextmanager
def service(address: str, name: str, path: str, methods: dict[tuple[str, str], Reply]) -> Iterator[None]:
    """Own ``name`` on the bus and answer ``methods`` ((interface, member) -> reply) at ``path``."""
    conn = open_dbus_connection(bus=address)
    conn.send_and_get_reply(message_bus.RequestName(name))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                msg = conn.receive(timeout=0.1)
            except TimeoutError:
                continue
            except OSError:
                return
            if msg.header.message_type != MessageType.method_call:
                continue
            fields = msg.header.fields
            key = (fields.get(2), fields.get(3))  # interface, member
            if fields.get(1) == path and key in methods:
                signature, body = methods[key](msg.body)
                conn.send(new_method_return(msg, signature, body))
            else:
                conn.send(new_error(msg, "org.freedesktop.DBus.Error.UnknownMethod"))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        conn.close()
