"""Test peers forked from a process that has already imported the engine.

A peer process spends about 2 s of CPU importing torch, aiortc and the engine before it does
anything, and a multi-peer test starts four to twelve of them on CI's two cores: minutes of
the suite went to imports. The launcher (tests/launcher_server.py) imports them
once; each test process it starts is a fork of it that runs the asked module as ``python -m``
would (``engine``: the real ``cotrain`` command line), with the test's arguments,
environment, working directory and standard streams, and gives back its exit status as
subprocess does (negative: killed by that signal).

``popen`` and ``create_subprocess_exec`` take their subprocess/asyncio namesakes' arguments;
what is not ``python -m MODULE`` of this interpreter (a namespace's prefix, another program),
or has another environment for what imports read, starts as they would start it, as does
everything under ``COTRAIN_TEST_LAUNCHER=exec``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

from tests.launcher_server import PID, STATUS

IMPORT_TIME = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "USE_HUB", "TORCH", "PYTORCH_", "OMP_", "MKL_",
               "OPENBLAS_", "CUDA_", "PYTHON", "LD_")
ROOT = Path(__file__).resolve().parent.parent




class _Launcher:
    """The launcher process of this test run, started at its first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        self.path = ""
        self.env: dict[str, str] = {}

    def environment(self) -> dict[str, str]:
        """The environment the launcher started with (starting it)."""
        self._ensure()
        return self.env

    def connect(self) -> socket.socket:
        self._ensure()
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        return conn

    def _ensure(self) -> None:
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                self._start()

    def _start(self) -> None:
        self.env = dict(os.environ)
        self.path = os.path.join(tempfile.mkdtemp(prefix="cotrain-launcher-"), "socket")
        self.process = subprocess.Popen([sys.executable, "-m", "tests.launcher_server", self.path], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], 120)
        if not ready or self.process.stdout.readline().strip() != "ready":
            raise RuntimeError("the test launcher did not start")
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()


_LAUNCHER = _Launcher()


def _module_of(command: list[str], env: dict | None) -> str | None:
    """The module ``command`` runs with ``python -m``, if it runs this interpreter so and
    nothing its imports read from the environment differs from the launcher's."""
    if os.environ.get("COTRAIN_TEST_LAUNCHER") == "exec":
        return None
    if len(command) < 3 or command[0] != sys.executable or command[1] != "-m":
        return None
    return None if _read_at_import(env) != _read_at_import(_LAUNCHER.environment()) else command[2]


def _read_at_import(env: dict | None) -> dict[str, str]:
    """The variables libraries read once, as they load (a model hub's address and offline
    mode, OpenMP's threads, ...): a child given others is started anew, or they would be the
    launcher's (a hub stand-in would see nothing of a child that asked the real hub)."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k.startswith(IMPORT_TIME)}


def _start(module: str, args: list[str], env: dict | None, cwd: Any,
           fds: list[int]) -> tuple[socket.socket, int]:
    request = json.dumps({"module": module, "args": args, "cwd": str(cwd or os.getcwd()),
                          "env": dict(os.environ if env is None else env)}).encode()
    conn = _LAUNCHER.connect()
    socket.send_fds(conn, [len(request).to_bytes(4, "big") + request], fds)
    pid = PID.unpack(_read(conn, PID.size))[0]
    return conn, pid


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _stream_fd(spec: Any, mode: int, opened: list[int]) -> tuple[int, int | None]:
    """The child's fd for a subprocess-style stream argument, and our end of a pipe."""
    if spec is None:
        return (0 if mode == os.O_RDONLY else 1), None
    if spec == subprocess.DEVNULL:
        fd = os.open(os.devnull, mode)
        opened.append(fd)
        return fd, None
    if spec == subprocess.PIPE:
        ours, theirs = os.pipe() if mode == os.O_WRONLY else os.pipe()[::-1]
        opened.append(theirs)
        return theirs, ours
    return (spec if isinstance(spec, int) else spec.fileno()), None


def _launch(module: str, args: list[str], stdin: Any, stdout: Any, stderr: Any, env: dict | None,
            cwd: Any) -> tuple[socket.socket, int, list[int | None]]:
    opened: list[int] = []
    try:
        streams = [_stream_fd(stdin, os.O_RDONLY, opened), _stream_fd(stdout, os.O_WRONLY, opened),
                   _stream_fd(stderr, os.O_WRONLY, opened)]
        conn, pid = _start(module, args, env, cwd, [fd for fd, _ in streams])
    finally:
        for fd in opened:
            os.close(fd)
    return conn, pid, [ours for _, ours in streams]


def _signal(pid: int, sig: int) -> None:
    """As subprocess does: a child that has exited (the launcher reaped it, its status is on
    its way) is not an error."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class LaunchedProcess:
    """What ``subprocess.Popen`` gives, for a child of the launcher."""

    def __init__(self, args: list[str], conn: socket.socket, pid: int, ends: list[int | None], text: bool):
        self.args, self.pid, self._conn, self.returncode = args, pid, conn, None
        self.stdin: IO | None = None if ends[0] is None else open(ends[0], "w" if text else "wb")  # noqa: SIM115
        self.stdout: IO | None = None if ends[1] is None else open(ends[1], "r" if text else "rb")  # noqa: SIM115
        self.stderr: IO | None = None if ends[2] is None else open(ends[2], "r" if text else "rb")  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self._conn], [], [], 0)[0]:
            self.wait()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self._conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            try:
                self.returncode = STATUS.unpack(_read(self._conn, STATUS.size))[0]
            except EOFError:  # the launcher is gone, and its children with it
                self.returncode = -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            _signal(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def popen(command: list[str], *, stdin: Any = None, stdout: Any = None, stderr: Any = None,
          env: dict | None = None, cwd: Any = None, text: bool = False) -> subprocess.Popen | LaunchedProcess:
    """``subprocess.Popen(command, ...)``, forked from the launcher where it can be."""
    module = _module_of(command, env)
    if module is None:
        return subprocess.Popen(command, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd,
                                text=text)
    conn, pid, ends = _launch(module, command[3:], stdin, stdout, stderr, env, cwd)
    return LaunchedProcess(command, conn, pid, ends, text)


class AsyncLaunchedProcess:
    """What ``asyncio.create_subprocess_exec`` gives, for a child of the launcher."""

    def __init__(self, conn: socket.socket, pid: int, stdout: asyncio.StreamReader | None):
        self.pid, self.stdout, self.stdin, self.stderr = pid, stdout, None, None
        conn.setblocking(False)
        self._exit = asyncio.ensure_future(self._exit_status(conn))

    @staticmethod
    async def _exit_status(conn: socket.socket) -> int:
        loop = asyncio.get_running_loop()
        data = b""
        try:
            while len(data) < STATUS.size:
                chunk = await loop.sock_recv(conn, STATUS.size - len(data))
                if not chunk:
                    return -signal.SIGKILL  # the launcher is gone, and its children with it
                data += chunk
            return STATUS.unpack(data)[0]
        finally:
            conn.close()

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            _signal(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def create_subprocess_exec(*command: str, stdin: Any = None, stdout: Any = None, stderr: Any = None,
                                 env: dict | None = None, cwd: Any = None) -> Any:
    """``asyncio.create_subprocess_exec(*command, ...)``, forked from the launcher where it can be."""
    module = await asyncio.to_thread(_module_of, list(command), env)  # (may start the launcher)
    if module is None:
        return await asyncio.create_subprocess_exec(*command, stdin=stdin, stdout=stdout, stderr=stderr,
                                                    env=env, cwd=cwd)
    conn, pid, ends = await asyncio.to_thread(_launch, module, list(command[3:]), stdin, stdout, stderr,
                                              env, cwd)
    reader = None
    if ends[1] is not None:
        reader = asyncio.StreamReader()
        pipe = open(ends[1], "rb", buffering=0)  # noqa: SIM115 - the transport owns it
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return AsyncLaunchedProcess(conn, pid, reader)
