"""Start Cotrain when the user logs in: an XDG autostart entry on Linux, the HKCU Run key on
Windows, a LaunchAgent on macOS. Each is per user and needs no administrator rights.
Called from a worker thread (these touch the disk or the registry)."""

from __future__ import annotations

import contextlib
import os
import plistlib
import re
import sys
from pathlib import Path

from engine.paths import engine_command

NAME = "Cotrain"
AGENT_LABEL = "org.cotrain.app"
RUN_KEY = r"Software\Microsoft\Windows\CurrentVersion\Run"


def launch_command() -> list[str]:
    """How the login session should start the app: the frozen app, or ``python -m engine``, in
    the background (in the tray, once the desktop's panel is up)."""
    return [*engine_command(), "--background"]


def _desktop_quote(arg: str) -> str:
    """Quoting as the Desktop Entry spec wants it (double quotes, backslash escapes)."""
    if arg and not re.search(r'[\s"\'\\`$<>~|&;*?#()]', arg):
        return arg
    return '"' + re.sub(r'(["`$\\])', r"\\\1", arg) + '"'


def _xdg_entry() -> Path:
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "autostart" / "cotrain.desktop"


def _launch_agent() -> Path:
    return Path.home() / "Library" / "LaunchAgents" / f"{AGENT_LABEL}.plist"


def is_enabled() -> bool:
    if sys.platform == "win32":
        import winreg

        try:
            with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY) as key:
                winreg.QueryValueEx(key, NAME)
            return True
        except OSError:
            return False
    if sys.platform == "darwin":
        return _launch_agent().exists()
    return _xdg_entry().exists()


def set_enabled(enabled: bool) -> None:
    command = launch_command()
    if sys.platform == "win32":
        import subprocess
        import winreg

        with winreg.OpenKey(winreg.HKEY_CURRENT_USER, RUN_KEY, 0, winreg.KEY_SET_VALUE) as key:
            if enabled:
                winreg.SetValueEx(key, NAME, 0, winreg.REG_SZ, subprocess.list2cmdline(command))
            else:
                with contextlib.suppress(FileNotFoundError):
                    winreg.DeleteValue(key, NAME)
        return
    target = _launch_agent() if sys.platform == "darwin" else _xdg_entry()
    if not enabled:
        target.unlink(missing_ok=True)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    if sys.platform == "darwin":
        agent = {"Label": AGENT_LABEL, "ProgramArguments": command, "RunAtLoad": True,
                 "ProcessType": "Interactive"}
        target.write_bytes(plistlib.dumps(agent))
        return
    target.write_text(
        "[Desktop Entry]\n"
        "Type=Application\n"
        f"Name={NAME}\n"
        "Comment=Contribute this computer's idle time to training models together\n"
        f"Exec={' '.join(_desktop_quote(arg) for arg in command)}\n"
        "Icon=cotrain\n"
        "Terminal=false\n"
        "X-GNOME-Autostart-enabled=true\n"
    )
