"""A real X server (Xvfb) for tests that need a screen; skipped, with the reason, without one."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest


def _free_display() -> int:
    for number in range(90 + os.getpid() % 400, 1000):
        if not Path(f"/tmp/.X11-unix/X{number}").exists() and not Path(f"/tmp/.X{number}-lock").exists():
            return number
    raise RuntimeError("no free X display number")


@contextmanager
def xvfb(size: str = "1280x800x24"):
    """Yield the DISPLAY of a fresh Xvfb; the server is killed afterwards."""
    if shutil.which("Xvfb") is None:
        pytest.skip("Xvfb is not installed (apt-get install xvfb); .ci/run installs it")
    number = _free_display()
    display = f":{number}"
    process = subprocess.Popen(["Xvfb", display, "-screen", "0", size, "-nolisten", "tcp"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    socket = Path(f"/tmp/.X11-unix/X{number}")
    deadline = time.monotonic() + 10
    while not socket.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"Xvfb did not start on {display}")
        time.sleep(0.05)
    try:
        yield display
    finally:
        process.terminate()
        process.wait(10)


def xdotool(display: str, *args: str) -> None:
    if shutil.which("xdotool") is None:
        pytest.skip("xdotool is not installed (apt-get install xdotool); .ci/run installs it")
    subprocess.run(["xdotool", *args], env={**os.environ, "DISPLAY": display}, check=True, timeout=10)
