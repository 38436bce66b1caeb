"""On a real X screen (Xvfb) with a real tray host (trayer): ``cotrain`` started at login docks
its icon once the desktop's tray comes up after it, clicking the icon opens the dashboard,
the keyboard reaches every page, the right button opens the menu. Screenshots of the tray,
the menu and each page go to tests/artifacts/."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from app.window import PAGES
from engine.paths import engine_command
from tests.xserver import xdotool, xvfb

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts" / "app"


def poll(condition, timeout: float, what: str):
    """Poll an X server we do not own an event loop for; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)  # polling another process's screen, not synchronising our own code


def x(display: str, *cmd: str) -> str:
    return subprocess.run(cmd, env={**os.environ, "DISPLAY": display}, capture_output=True, text=True,
                          timeout=20).stdout


def windows(display: str) -> list[tuple[int, str, str, int, int, int, int]]:
    """(depth, id, name, width, height, absolute x, absolute y) of every window."""
    found = []
    for line in x(display, "xwininfo", "-root", "-tree").splitlines():
        m = re.match(r'^(\s+)(0x[0-9a-f]+) (".*?"|\(has no name\)).*?'
                     r'(\d+)x(\d+)[+-]-?\d+[+-]-?\d+\s+\+(-?\d+)\+(-?\d+)', line)
        if m:
            found.append((len(m[1]), m[2], m[3].strip('"'), int(m[4]), int(m[5]), int(m[6]), int(m[7])))
    return found


def docked_icon(display: str):
    """The Cotrain window trayer has swallowed: a descendant of trayer's panel."""
    tree = windows(display)
    for i, (depth, _, name, *_rest) in enumerate(tree):
        if name == "panel":
            for below in tree[i + 1:]:
                if below[0] <= depth:
                    break
                if below[2] == "Cotrain" and below[3] > 1:
                    return below
    return None


def main_window(display: str) -> str | None:
    """The id of the visible main window (the big one titled "<page> — Cotrain")."""
    for win in x(display, "xdotool", "search", "--onlyvisible", "--name", " — Cotrain$").split():
        info = x(display, "xwininfo", "-id", win)
        size = re.search(r"Width: (\d+).*Height: (\d+)", info, re.S)
        if size and int(size[1]) >= 800 and int(size[2]) >= 500:
            return win
    return None


def window_name(display: str, window: str) -> str:
    return x(display, "xdotool", "getwindowname", window).strip()


def grab(display: str, target: str, crop: str | None = None) -> bytes:
    cmd = ["import", "-window", target] + (["-crop", crop] if crop else []) + ["png:-"]
    return subprocess.run(cmd, env={**os.environ, "DISPLAY": display}, check=True, timeout=30,
                          capture_output=True).stdout


def shoot_when_changed(display: str, target: str, name: str, before: bytes = b"",
                       crop: str | None = None) -> bytes:
    """Save a screenshot once it differs from ``before`` (the change we caused has painted)."""
    image = poll(lambda: (shot := grab(display, target, crop)) != before and shot, 15, f"{name} to paint")
    (ARTIFACTS / f"{name}.png").write_bytes(image)
    return image


def test_the_tray_icon_docks_and_opens_the_dashboard(tmp_path):
    for tool in ("trayer", "import", "xwininfo"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed (apt-get install trayer imagemagick x11-utils; "
                        ".ci/apt-packages lists them)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "cotrain"
    data.mkdir()
    # Not the first run (that opens the window by itself): the app starts in the tray.
    (data / "settings.ini").write_text('[current]\nbackbone=local\nproject=demo-lm\n'
                                       '[General]\nlimits="{\\"threads\\": 1, \\"low_priority\\": false}"\n')
    with xvfb("1280x800x24") as display:
        env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
        env.update(DISPLAY=display, HOME=str(tmp_path), COTRAIN_HOME=str(data), OMP_NUM_THREADS="1")
        log = (tmp_path / "cotrain.log").open("wb")
        # As at login: the app first, the desktop's tray after it (both orders happen there; an
        # app that looked for the tray only once stayed without an icon when it lost this race).
        app = subprocess.Popen([*engine_command(), "--background"], env=env, stdout=log, stderr=log)
        tray_host = None
        try:
            # The worker is up: the app has looked for a tray and found none.
            url = poll(lambda: _local_backbone(data), 60, "the local backbone")
            assert docked_icon(display) is None and main_window(display) is None
            tray_host = subprocess.Popen(
                ["trayer", "--edge", "top", "--align", "right", "--widthtype", "request", "--height", "32",
                 "--SetDockType", "true", "--transparent", "false", "--tint", "0x303030"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            poll(lambda: docked_icon(display), 60, "the tray icon to dock in trayer")
            assert main_window(display) is None  # only the icon, no window yet
            # Screenshots of a collaboration that has taken a step: numbers, a loss point.
            poll(lambda: _epoch(url) >= 1, 120, "the first step of the local collaboration")
            tray = shoot_when_changed(display, "root", "tray", crop=f"220x40+{1280 - 220}+0")
            _, _, _, width, height, left, top = docked_icon(display)  # trayer lays icons out anew
            xdotool(display, "mousemove", str(left + width // 2), str(top + height // 2), "click", "1")
            window = poll(lambda: main_window(display), 30, "the dashboard to open")
            assert window_name(display, window) == "Dashboard — Cotrain"
            shot = shoot_when_changed(display, window, "dashboard")
            for i, (page, title) in enumerate(PAGES[1:], start=2):
                xdotool(display, "windowfocus", "--sync", window)
                xdotool(display, "key", f"ctrl+{i}")
                # The title changes with the page: then the page is the one on screen.
                poll(lambda t=f"{title} — Cotrain": window_name(display, window) == t, 10, f"the {page} page")
                shot = shoot_when_changed(display, window, page, before=shot)
            xdotool(display, "key", "ctrl+1")
            menu_area = f"320x260+{1280 - 320}+0"
            before = grab(display, "root", menu_area)
            xdotool(display, "mousemove", str(left + width // 2), str(top + height // 2), "click", "3")
            poll(lambda: any(w[2] == "Cotrain" and 150 < w[3] < 400 and 150 < w[4] < 400
                             for w in windows(display)), 10, "the tray menu")
            menu = shoot_when_changed(display, "root", "tray-menu", before=before, crop=menu_area)
            assert menu != tray
            xdotool(display, "key", "Escape")
        finally:
            app.send_signal(signal.SIGTERM)
            try:
                code = app.wait(45)  # the app gives its worker 15 s, then kills it
            except subprocess.TimeoutExpired:
                app.kill()
                code = app.wait(10)
            if tray_host is not None:
                tray_host.terminate()
                tray_host.wait(10)
            log.close()
        assert code == 0, (tmp_path / "cotrain.log").read_text()[-2000:]
    for name in ("tray", "tray-menu", *(page for page, _ in PAGES)):
        assert (ARTIFACTS / f"{name}.png").exists()


def _local_backbone(data: Path) -> str | None:
    """The worker logs where it hosts the local backbone."""
    log = data / "worker.log"
    if not log.exists():
        return None
    found = re.search(r"local backbone on (http://\S+)", log.read_text(errors="replace"))
    return found[1] if found else None


def _epoch(url: str) -> int:
    """The local collaboration's epoch (-1 while its backbone, busy training, is slow to answer)."""
    try:
        with urllib.request.urlopen(f"{url}/api/projects", timeout=5) as resp:
            return json.load(resp)["projects"][0]["epoch"]
    except OSError:
        return -1

