"""A soak of the desktop app as a volunteer runs it: ``cotrain`` on a real X screen (Xvfb)
with the dashboard open and both plots painting, training demo-lm on this computer, for
``--minutes`` (10 by default), then a clean quit -- the app must still be running at the
end and exit 0. (PySide6-Essentials 6.12.0 aborted it after about two minutes.)

    python -m tests.app.soak [--minutes 10]

prints one JSON line: minutes, the collaboration's epochs, the app's and the worker's memory
at the start and the end, the exit status."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

from engine.paths import engine_command
from tests.app.test_xvfb import _local_backbone, main_window
from tests.xserver import xvfb

SETTINGS = '[current]\nbackbone=local\nproject=demo-lm\n[General]\nlimits="{\\"threads\\": 1}"\n'


def epoch(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/api/projects", timeout=5) as resp:
            return json.load(resp)["projects"][0]["epoch"]
    except OSError:
        return -1


def memory(app: psutil.Process) -> tuple[int, int]:
    """Resident MB of the app and of its worker."""
    children = app.children(recursive=True)
    worker = max((c.memory_info().rss for c in children), default=0)
    return app.memory_info().rss // 2**20, worker // 2**20


def wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        if time.monotonic() > deadline:
            raise SystemExit(f"soak: timed out waiting for {what}")
        time.sleep(1)  # polling another process, not synchronising our own code
    return result


def soak(minutes: float) -> dict:
    with tempfile.TemporaryDirectory() as root, xvfb() as display:
        data = Path(root) / "cotrain"
        data.mkdir()
        (data / "settings.ini").write_text(SETTINGS)  # not the first run: straight to training
        env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
        env.update(DISPLAY=display, HOME=root, COTRAIN_HOME=str(data))
        log = (Path(root) / "app.log").open("wb")
        app = subprocess.Popen([*engine_command()], env=env, stdout=log, stderr=log)
        try:
            url = wait(lambda: _local_backbone(data), 120, "the local backbone")
            wait(lambda: main_window(display), 60, "the dashboard window")
            wait(lambda: epoch(url) >= 1, 300, "the first step")
            process = psutil.Process(app.pid)
            first_epoch, first_memory, began = epoch(url), memory(process), time.monotonic()
            while time.monotonic() - began < minutes * 60:
                if app.poll() is not None:
                    raise SystemExit(f"soak: the app died after {(time.monotonic() - began) / 60:.1f} "
                                     f"minutes, status {app.returncode}:\n"
                                     f"{(Path(root) / 'app.log').read_text(errors='replace')[-3000:]}")
                time.sleep(5)
            last_epoch, last_memory = epoch(url), memory(process)
        finally:
            app.send_signal(signal.SIGTERM)
            try:
                code = app.wait(60)
            except subprocess.TimeoutExpired:
                app.kill()
                code = app.wait(10)
            log.close()
    return {"minutes": minutes, "epochs": last_epoch - first_epoch,
            "app_mb": [first_memory[0], last_memory[0]], "worker_mb": [first_memory[1], last_memory[1]],
            "exit": code}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    figures = soak(parser.parse_args().minutes)
    print(json.dumps(figures), flush=True)
    return 0 if figures["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
