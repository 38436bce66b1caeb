"""The launcher's own process (``python -m tests.launcher_server SOCKET``, started by
tests/launcher.py): imports what a peer imports once, then forks a child per request that
runs the asked module as a new ``python -m`` would, and sends back its pid and exit status."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import threading
import traceback

PRELOADED = ("torch", "numpy", "aiortc", "aiohttp", "engine.cli", "engine.peer.runner",
             "engine.backbone.server", "engine.tasks", "tests.hostile.adversary",
             # 3.5 s more for a peer of a transformers project: the presets' families
             "transformers.models.auto.modeling_auto", "transformers.models.albert.modeling_albert",
             "transformers.models.gpt2.modeling_gpt2", "transformers.tokenization_utils_fast")
PID, STATUS = struct.Struct("q"), struct.Struct("i")

def serve(path: str) -> None:
    """Import, then fork a child for each request until stdin closes (the test run ended);
    the children still running then are killed."""
    for module in PRELOADED:
        importlib.import_module(module)
    assert threading.active_count() == 1, "a Python thread in the launcher would be lost in every fork"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    print("ready", flush=True)
    try:
        while True:
            for key, _ in selector.select():
                if key.data == "stdin":
                    return
                if key.data == "accept":
                    conn, _ = listener.accept()
                    pid = _fork(conn, [listener, selector, *[c for _, c in running.values()]], list(running))
                    if pid is not None:
                        pidfd = os.pidfd_open(pid)
                        running[pidfd] = (pid, conn)
                        selector.register(pidfd, selectors.EVENT_READ, "exit")
                    continue
                pid, conn = running.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    conn.sendall(STATUS.pack(os.waitstatus_to_exitcode(status)))
                conn.close()
    finally:
        for pid, _ in running.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _fork(conn: socket.socket, inherited: list, pidfds: list[int]) -> int | None:
    """Read a request from ``conn`` and fork its child; the child never returns."""
    try:
        request, fds = _receive(conn)
    except (OSError, ValueError) as error:
        print(f"launcher: a broken request ({error})", file=sys.stderr, flush=True)
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _become(request, fds, [conn, *inherited], pidfds)
    for fd in fds:
        os.close(fd)
    conn.sendall(PID.pack(pid))
    return pid


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    if len(fds) != 3 or len(data) < 4:
        raise ValueError("expected a length, a request and three file descriptors")
    size = int.from_bytes(data[:4], "big")
    body = bytearray(data[4:])
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("the request ended early")
        body += chunk
    return json.loads(body), list(fds)


def _become(request: dict, fds: list[int], inherited: list, pidfds: list[int]) -> None:
    """In the fork: what a fresh ``python -m MODULE ARGS`` started by subprocess would be."""
    code = 1
    try:
        for thing in inherited:
            thing.close()
        for fd in pidfds:
            os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds) - {0, 1, 2}:
            os.close(fd)
        _die_with_the_launcher()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import numpy

        numpy.random.seed()  # a fresh process's; random reseeds itself in a fork
        import engine

        importlib.reload(engine)  # its floor over the environment, as at a process's first import
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as leaving:
        code = _exit_code(leaving.code)
    except BaseException:  # a child reports everything, as an interpreter would
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _die_with_the_launcher() -> None:
    """A child outlives nothing: if the launcher is killed, so is it (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() == 1:
        os._exit(1)


if __name__ == "__main__":
    serve(sys.argv[1])
