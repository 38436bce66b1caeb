"""How long since the user last touched keyboard or mouse, one chain of sources per OS.

Every source says whether it worked and, if not, why; when none works the answer is
"unavailable" (None), shown as such — never a guess.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


class IdleUnavailable(RuntimeError):
    pass


class IdleSource:
    name = "?"

    def idle_seconds(self) -> float:
        raise NotImplementedError


class WindowsIdle(IdleSource):
    name = "Windows GetLastInputInfo"

    def idle_seconds(self) -> float:
        if sys.platform != "win32":
            raise IdleUnavailable("not Windows")

        class LastInputInfo(ctypes.Structure):
            _fields_ = [("cbSize", ctypes.c_uint), ("dwTime", ctypes.c_uint)]

        info = LastInputInfo(ctypes.sizeof(LastInputInfo), 0)
        windll = getattr(ctypes, "windll")  # noqa: B009 (Windows only: not in typeshed elsewhere)
        if not windll.user32.GetLastInputInfo(ctypes.byref(info)):
            raise IdleUnavailable("GetLastInputInfo failed")
        ticks = windll.kernel32.GetTickCount()
        return ((ticks - info.dwTime) & 0xFFFFFFFF) / 1000.0


class MacIdle(IdleSource):
    name = "macOS HIDIdleTime"

    def idle_seconds(self) -> float:
        if sys.platform != "darwin":
            raise IdleUnavailable("not macOS")
        try:
            out = subprocess.run(["ioreg", "-c", "IOHIDSystem", "-d", "4"], capture_output=True,
                                 text=True, timeout=2, check=True).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise IdleUnavailable(f"ioreg failed: {exc}") from None
        match = re.search(r'"HIDIdleTime"\s*=\s*(\d+)', out)
        if not match:
            raise IdleUnavailable("ioreg shows no HIDIdleTime")
        return int(match.group(1)) / 1e9


class _DBusIdle(IdleSource):
    """A method on the session (or system) bus, through jeepney."""

    bus = "SESSION"
    destination = path = interface = method = ""
    scale = 1.0

    def idle_seconds(self) -> float:
        if not sys.platform.startswith("linux"):
            raise IdleUnavailable("not Linux")
        try:
            from jeepney import DBusAddress, DBusErrorResponse, new_method_call
            from jeepney.io.blocking import open_dbus_connection
            from jeepney.wrappers import unwrap_msg
        except ImportError:
            raise IdleUnavailable("jeepney is not installed") from None
        try:
            with open_dbus_connection(bus=self.bus) as conn:
                address = DBusAddress(self.path, bus_name=self.destination, interface=self.interface)
                # An error reply (no such service: any desktop but this one) comes back as a
                # message like any other; unwrapping raises it.
                body = unwrap_msg(conn.send_and_get_reply(self._call(new_method_call, address), timeout=1))
        except KeyError:
            raise IdleUnavailable(f"no D-Bus {self.bus.lower()} bus") from None
        except FileNotFoundError:
            raise IdleUnavailable(f"no D-Bus {self.bus.lower()} bus socket") from None
        except DBusErrorResponse as exc:
            detail = exc.data[0] if exc.data else ""
            raise IdleUnavailable(f"{exc.name.rsplit('.', 1)[-1]}: {detail}") from None
        except Exception as exc:  # a refused connection, a timeout: all mean "not here"
            raise IdleUnavailable(f"{type(exc).__name__}: {exc}") from None
        try:
            return self._read(body)
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise IdleUnavailable(f"unexpected answer {body!r:.80}: {exc}") from None

    def _call(self, new_method_call, address):
        return new_method_call(address, self.method)

    def _read(self, body) -> float:
        return float(body[0]) * self.scale


class MutterIdle(_DBusIdle):
    name = "GNOME Mutter IdleMonitor"
    destination = "org.gnome.Mutter.IdleMonitor"
    path = "/org/gnome/Mutter/IdleMonitor/Core"
    interface = "org.gnome.Mutter.IdleMonitor"
    method = "GetIdletime"
    scale = 1e-3  # milliseconds


class ScreenSaverIdle(_DBusIdle):
    name = "org.freedesktop.ScreenSaver"
    destination = "org.freedesktop.ScreenSaver"
    path = "/org/freedesktop/ScreenSaver"
    interface = "org.freedesktop.ScreenSaver"
    method = "GetSessionIdleTime"
    scale = 1e-3  # KDE and others answer in milliseconds


class LogindIdle(_DBusIdle):
    """logind only knows whether the session is idle and since when: coarse, but everywhere."""

    name = "logind IdleHint"
    bus = "SYSTEM"
    destination = "org.freedesktop.login1"
    path = "/org/freedesktop/login1/session/auto"
    interface = "org.freedesktop.DBus.Properties"
    method = "GetAll"

    def _call(self, new_method_call, address):
        return new_method_call(address, "GetAll", "s", ("org.freedesktop.login1.Session",))

    def _read(self, body) -> float:
        props = body[0]
        if "IdleHint" not in props:
            raise IdleUnavailable("the session has no IdleHint")
        if not props["IdleHint"][1]:
            return 0.0
        since = props.get("IdleSinceHintMonotonic", ("t", 0))[1] / 1e6
        if since <= 0:
            raise IdleUnavailable("IdleHint is set but not since when")
        return max(time.clock_gettime(time.CLOCK_MONOTONIC) - since, 0.0)


class XScreenSaverIdle(IdleSource):
    """X11's screen-saver extension, through ctypes (libX11 and libXss)."""

    name = "X11 XScreenSaver"

    class _Info(ctypes.Structure):
        _fields_ = [("window", ctypes.c_ulong), ("state", ctypes.c_int), ("kind", ctypes.c_int),
                    ("til_or_since", ctypes.c_ulong), ("idle", ctypes.c_ulong),
                    ("eventMask", ctypes.c_ulong)]

    def __init__(self) -> None:
        self._opened: tuple[ctypes.CDLL, ctypes.CDLL, int] | None = None  # libX11, libXss, display

    def idle_seconds(self) -> float:
        if not sys.platform.startswith("linux"):
            raise IdleUnavailable("not Linux")
        if self._opened is None:
            self._opened = self._open()
        x11, xss, display = self._opened
        info = xss.XScreenSaverAllocInfo()
        try:
            root = x11.XDefaultRootWindow(display)
            if not xss.XScreenSaverQueryInfo(display, root, info):
                raise IdleUnavailable("XScreenSaverQueryInfo failed")
            return info.contents.idle / 1000.0
        finally:
            x11.XFree(info)

    def _open(self) -> tuple[ctypes.CDLL, ctypes.CDLL, int]:
        x11_path, xss_path = _library("X11"), _library("Xss")
        if not x11_path or not xss_path:
            raise IdleUnavailable("libX11 or libXss is not installed")
        x11, xss = ctypes.CDLL(x11_path), ctypes.CDLL(xss_path)
        x11.XOpenDisplay.restype = ctypes.c_void_p
        x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
        x11.XDefaultRootWindow.restype = ctypes.c_ulong
        x11.XDefaultRootWindow.argtypes = [ctypes.c_void_p]
        x11.XFree.argtypes = [ctypes.c_void_p]
        xss.XScreenSaverAllocInfo.restype = ctypes.POINTER(self._Info)
        xss.XScreenSaverQueryInfo.argtypes = [ctypes.c_void_p, ctypes.c_ulong, ctypes.POINTER(self._Info)]
        display = x11.XOpenDisplay(None)
        if not display:
            raise IdleUnavailable("cannot open the X display (is DISPLAY set?)")
        return x11, xss, display


@functools.cache
def _library(name: str) -> str | None:
    """Once a run: find_library runs ``ldconfig -p``, and a machine without a display would
    otherwise run it at every reading, once a second for as long as the peer runs."""
    return ctypes.util.find_library(name)


def default_sources() -> list[IdleSource]:
    if sys.platform == "win32":
        return [WindowsIdle()]
    if sys.platform == "darwin":
        return [MacIdle()]
    return [MutterIdle(), ScreenSaverIdle(), XScreenSaverIdle(), LogindIdle()]


@dataclass
class IdleReading:
    seconds: float | None
    source: str | None
    problems: dict[str, str] = field(default_factory=dict)

    @property
    def describe(self) -> str:
        if self.source:
            return f"idle time from {self.source}"
        tried = "; ".join(f"{name}: {why}" for name, why in self.problems.items())
        return f"idle detection unavailable ({tried})"


class IdleDetector:
    """Tries the sources in order; sticks to the first that works until it stops working."""

    def __init__(self, sources: list[IdleSource] | None = None) -> None:
        self.sources = sources if sources is not None else default_sources()
        self._working: IdleSource | None = None

    def read(self) -> IdleReading:
        problems: dict[str, str] = {}
        first = [self._working] if self._working else []
        ordered = first + [s for s in self.sources if s is not self._working]
        for source in ordered:
            try:
                seconds = source.idle_seconds()
            except IdleUnavailable as exc:
                problems[source.name] = str(exc)
                continue
            except Exception as exc:  # a bug in one source must not stop the governor
                log.warning("idle source %s failed", source.name, exc_info=True)
                problems[source.name] = f"failed: {exc!r}"
                continue
            if source is not self._working:
                log.info("idle time from %s", source.name)
                self._working = source
            return IdleReading(seconds, source.name, problems)
        if self._working is not None:
            log.warning("idle detection stopped working: %s", problems)
        self._working = None
        return IdleReading(None, None, problems)
