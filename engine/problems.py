"""One place that turns a failure into a sentence a volunteer understands: what failed, and
what they can do about it. Raw library text ("Cannot connect to host 127.0.0.1:1 ssl:default
[Connect call failed ...]", "[Errno 111]") goes to the log only."""

from __future__ import annotations

import asyncio
import errno
import socket
import ssl
from urllib.parse import urlsplit

SHORT = 60  # characters: what a tray menu item or a title shows


def where(url: str) -> str:
    """``host:port`` of a URL, for sentences."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or url
    return f"{host}:{port}" if port else host


def unreachable(url: str, exc: BaseException) -> str:
    """Why the backbone at ``url`` could not be talked to."""
    place = where(url)
    cause = _root(exc)
    if isinstance(cause, socket.gaierror):
        return f"Cannot find {place}: check the address and this computer's internet connection."
    if isinstance(cause, ssl.SSLError):
        return f"The secure connection to {place} failed: its certificate may be wrong or expired."
    if isinstance(cause, (asyncio.TimeoutError, TimeoutError, socket.timeout)):
        return f"The backbone at {place} does not answer."
    if isinstance(cause, ConnectionRefusedError) or getattr(cause, "errno", None) == errno.ECONNREFUSED:
        return f"Nothing answers at {place}: the backbone is not running there, or the address is wrong."
    if isinstance(cause, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return f"The backbone at {place} closed the connection."
    if getattr(cause, "errno", None) in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return f"Cannot reach {place}: this computer seems to be offline."
    return f"Cannot reach the backbone at {place}."


def retrying(sentence: str, seconds: float) -> str:
    return f"{sentence.rstrip('.')}. Trying again in {seconds:.0f} s."


def short(sentence: str, limit: int = SHORT) -> str:
    """The start of ``sentence``, for a menu item (the whole of it goes in a tooltip)."""
    first = sentence.split(": ", 1)[0] if len(sentence) > limit else sentence
    return first if len(first) <= limit else first[:limit - 1].rstrip() + "…"


def _root(exc: BaseException) -> BaseException:
    """The error underneath the wrappers (aiohttp and urllib wrap OSErrors)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "os_error", None) or getattr(exc, "reason", None) or exc.__cause__
        if not isinstance(inner, BaseException):
            break
        exc = inner
    return exc
