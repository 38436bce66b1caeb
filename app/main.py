"""``cotrain`` with no arguments: the desktop app, or — with no display — the same
collaboration in the terminal (engine/worker/terminal.py), with the choices made in the app.

The GUI process holds windows and the tray only; the engine runs in the worker child
process (app/manager.py), and an embedded backbone, when used, lives in that worker.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

log = logging.getLogger(__name__)


def has_display() -> bool:
    if os.environ.get("QT_QPA_PLATFORM", "").startswith("offscreen"):
        return True
    if sys.platform.startswith("linux"):
        return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return True


def main(argv: list[str] | None = None, background: bool = False) -> int:
    import multiprocessing

    multiprocessing.freeze_support()
    logging.basicConfig(level=logging.INFO if os.environ.get("COTRAIN_DEBUG") else logging.WARNING,
                        stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not has_display():
        return _in_terminal()
    try:
        from PySide6.QtWidgets import QApplication
    except ImportError as exc:
        log.warning("the desktop app needs PySide6 (%s); contributing from the terminal instead", exc)
        return _in_terminal()

    from app.application import CotrainApp
    from app.instance import NotAnswering, ask_running_instance

    # argv[0] names the X11 window class: "cotrain", not "__main__.py".
    qt = QApplication(["cotrain", *(argv or [])])
    qt.setApplicationName("Cotrain")
    qt.setDesktopFileName("cotrain")
    qt.setQuitOnLastWindowClosed(False)
    try:
        if ask_running_instance():
            log.info("Cotrain is already running; asked it to show its window")
            return 0
    except NotAnswering as exc:
        print(f"cotrain: {exc}", file=sys.stderr)
        return 1
    app = CotrainApp(background=background)
    signal.signal(signal.SIGINT, lambda *_: app.controller.quit())
    signal.signal(signal.SIGTERM, lambda *_: app.controller.quit())
    # exit(), not quit(): Qt 6's quit() first asks every window to close, and the main window
    # refuses (it hides to the tray), which silently cancelled Quit while it was open.
    app.finished.connect(lambda: qt.exit(0))
    app.start()
    code = qt.exec()
    if app.tray is not None:
        app.tray.hide()  # (now: the program leaves without Qt's teardown, which would remove it)
    # Queued lookups (a backbone that stopped answering, a LAN browse) must not hold Quit up.
    if not app.controller.client.shutdown(3000):
        log.info("quitting with backbone lookups still running")
    return code


def _in_terminal() -> int:
    from engine.worker.terminal import Choices, run

    try:
        from app.settings_store import SettingsStore
    except ImportError as exc:
        return run(Choices(note=f"cannot read the app's settings ({exc}); using the default limits"))
    store = SettingsStore()
    current = store.current()
    if current is None:
        return run(Choices(store.limits(), note="you left every project in the app; contributing to "
                                                "demo-lm on this computer"))
    return run(Choices(store.limits(), current.backbone, current.project))


if __name__ == "__main__":
    raise SystemExit(main())
