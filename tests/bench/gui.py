"""The desktop app as a user feels it.

    python -m tests.bench.gui [--quick]

1. Event-loop latency while the worker trains demo-lm at full load on every core: a 10 ms
   precise timer in the GUI process, its lateness p50 / p99 / max (target p99 < 50 ms),
   with the dashboard shown and updating. Once with the shipped default (the worker at the
   lowest OS priority) and once at normal priority.
2. Start to tray icon visible: ``cotrain`` under Xvfb with trayer as the tray host, from
   launch until trayer has docked the icon (needs Xvfb, trayer, xwininfo).
3. The GUI process's resident memory while running (and the worker's, for comparison).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

TICK_MS = 10


def _wait(condition, timeout: float, what: str) -> None:
    from PySide6.QtCore import QEventLoop, QTimer

    loop, timer = QEventLoop(), QTimer(interval=20)
    timer.timeout.connect(loop.quit)
    timer.start()
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        loop.exec()
    timer.stop()


def jitter(seconds: float, low_priority: bool) -> dict:
    from PySide6.QtCore import QEventLoop, Qt, QTimer

    from app.application import CotrainApp
    from app.controller import Controller
    from app.settings_store import SettingsStore
    from engine.governor.limits import Limits

    with tempfile.TemporaryDirectory() as home:
        os.environ["COTRAIN_HOME"] = home
        store = SettingsStore()
        store.set_limits(Limits(low_priority=low_priority))  # all cores, no duty cycle
        app = CotrainApp(Controller(store=store), tray=False, single_instance=False)
        app.start()
        try:
            c = app.controller
            _wait(lambda: c.last_stats is not None and c.state.kind == "contributing", 120,
                  "the worker to train")
            worker = psutil.Process(app.controller.manager.pid)
            worker.cpu_percent()
            late: list[float] = []
            last = [time.perf_counter()]

            def tick() -> None:
                now = time.perf_counter()
                late.append(max(now - last[0] - TICK_MS / 1000, 0.0) * 1000)
                last[0] = now

            timer = QTimer(interval=TICK_MS, timerType=Qt.TimerType.PreciseTimer)
            timer.timeout.connect(tick)
            stop = QEventLoop()
            QTimer.singleShot(int(seconds * 1000), stop.quit)
            last[0] = time.perf_counter()
            timer.start()
            stop.exec()
            timer.stop()
            cpu = worker.cpu_percent()
            gui_rss = psutil.Process().memory_info().rss / 1e6
            worker_rss = worker.memory_info().rss / 1e6
        finally:
            done = QEventLoop()
            app.controller.manager.stopped.connect(done.quit)
            app.controller.quit()
            if app.controller.manager.running:
                QTimer.singleShot(30_000, done.quit)
                done.exec()
            app.window.hide()
    late.sort()
    return {"p50": statistics.median(late), "p99": late[int(len(late) * 0.99)], "max": late[-1],
            "ticks": len(late), "worker_cpu": cpu, "gui_rss": gui_rss, "worker_rss": worker_rss}


def tray_start() -> dict | None:
    """Seconds from launching ``cotrain`` to its icon docked in trayer, and its RSS then."""
    if not all(shutil.which(t) for t in ("Xvfb", "trayer", "xwininfo")):
        return None
    from engine.paths import engine_command
    from tests.app.test_xvfb import docked_icon
    from tests.xserver import _free_display

    display = f":{_free_display()}"
    server = subprocess.Popen(["Xvfb", display, "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as home:
        data = Path(home) / "cotrain"
        data.mkdir()
        (data / "settings.ini").write_text("[current]\nbackbone=local\nproject=demo-lm\n")
        env = {k: v for k, v in os.environ.items() if k != "QT_QPA_PLATFORM"}
        env.update(DISPLAY=display, HOME=home, COTRAIN_HOME=str(data))
        tray = app = None
        try:
            while not Path(f"/tmp/.X11-unix/X{display[1:]}").exists():
                time.sleep(0.05)  # the X server starting, not the system under test
            tray = subprocess.Popen(["trayer", "--edge", "top", "--align", "right", "--widthtype", "request"],
                                    env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            while "panel" not in subprocess.run(["xwininfo", "-root", "-tree"], env=env, capture_output=True,
                                                text=True).stdout:
                time.sleep(0.05)
            began = time.perf_counter()
            app = subprocess.Popen(engine_command(), env=env, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
            while docked_icon(display) is None:
                if time.perf_counter() - began > 120:
                    raise TimeoutError("the tray icon never docked")
                time.sleep(0.02)
            seconds = time.perf_counter() - began
            rss = psutil.Process(app.pid).memory_info().rss / 1e6
        finally:
            for process in (app, tray):
                if process is not None:
                    process.terminate()
                    try:
                        process.wait(30)
                    except subprocess.TimeoutExpired:
                        process.kill()
            server.terminate()
            server.wait(10)
    return {"seconds": seconds, "rss": rss}


def main(quick: bool = False) -> None:
    from PySide6.QtWidgets import QApplication

    qt = QApplication.instance() or QApplication(["cotrain-bench"])
    seconds = 10.0 if quick else 30.0
    print(f"\n== desktop app: GUI event loop while the worker trains demo-lm on {os.cpu_count()} cores")
    print(f"{'worker priority':<18}{'p50 ms':>8}{'p99 ms':>8}{'max ms':>8}{'ticks':>7}{'worker CPU':>12}")
    figures = {}
    for label, low in (("lowest (default)", True), ("normal", False)):
        r = jitter(seconds, low)
        figures[label] = r
        print(f"{label:<18}{r['p50']:>8.2f}{r['p99']:>8.2f}{r['max']:>8.1f}{r['ticks']:>7}"
              f"{r['worker_cpu']:>11.0f}%")
    target = all(r["p99"] < 50 for r in figures.values())
    print(f"p99 < 50 ms: {'yes' if target else 'NO'}")
    tray = tray_start()
    if tray is None:
        print("start to tray icon visible: skipped (needs Xvfb, trayer and xwininfo)")
    else:
        print(f"start to tray icon visible: {tray['seconds']:.2f} s (cotrain under Xvfb, trayer as the tray)")
        print(f"GUI process RSS, tray app just started: {tray['rss']:.0f} MB")
    r = figures["lowest (default)"]
    print(f"GUI process RSS while running, dashboard shown: {r['gui_rss']:.0f} MB "
          f"(worker: {r['worker_rss']:.0f} MB)")
    del qt


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
