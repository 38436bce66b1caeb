"""Everything that may wait — HTTP to backbones, the keyring, files — runs on a thread pool;
results come back to the GUI thread as queued signals. The GUI thread never blocks.

Account calls reuse engine/login.py and logins engine/credentials.py, as the CLI does.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal

from engine.credentials import CredentialStore, Login
from engine.login import log_in, log_out, register
from engine.problems import unreachable, where
from engine.urls import backbone_key
from engine.wire import ProtocolError
from engine.wire.rest import (
    MAX_REPLY,
    Curve,
    ErrorReply,
    Health,
    Leaderboard,
    Me,
    ProjectList,
    Ranking,
    reply_codec,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
TIMEOUT = 10.0
THREADS = 8  # lookups in flight at once; more wait their turn
DISCOVERY_SECONDS = 2.0


class BackboneUnavailable(RuntimeError):
    """The backbone could not be reached or refused; the message is for people."""


class _Reply(QObject):
    done = Signal(object)
    failed = Signal(str)


class _Job(QRunnable):
    def __init__(self, fn: Callable[[], Any], reply: _Reply) -> None:
        super().__init__()
        self.fn, self.reply = fn, reply

    def run(self) -> None:
        try:
            result = self.fn()
        except Exception as exc:  # every failure becomes a message for the caller
            if not isinstance(exc, (BackboneUnavailable, OSError, ValueError, RuntimeError)):
                log.exception("background job failed")
            self.reply.failed.emit(str(exc) or type(exc).__name__)
        else:
            self.reply.done.emit(result)


def get(url: str, answer: type[T], token: str | None = None) -> T:
    """GET ``url`` as ``answer`` (one of engine.wire.rest's Structs; blocking, call from the
    pool); errors and answers that are not what a backbone sends become BackboneUnavailable."""
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
            return reply_codec(answer).decode(resp.read(MAX_REPLY + 1))
    except urllib.error.HTTPError as exc:
        try:
            reason = reply_codec(ErrorReply).decode(exc.read(MAX_REPLY + 1)).error
        except (ProtocolError, OSError):
            reason = f"the backbone answered {exc.code}"
        raise BackboneUnavailable(reason) from None
    except (urllib.error.URLError, OSError) as exc:
        log.info("GET %s failed: %r", url, exc)
        raise BackboneUnavailable(unreachable(url, exc)) from None
    except ProtocolError as exc:
        log.info("GET %s: %s", url, exc)
        raise BackboneUnavailable(f"{where(url)} did not answer as a Cotrain backbone does.") from None


class BackboneCalls(QObject):
    """Calls return at once; ``on_done(result)`` or ``on_error(message)`` run later on the GUI
    thread."""

    def __init__(self, pool: QThreadPool | None = None, credentials: CredentialStore | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        # Our own pool, never Qt's global one, and quitting drops what is still queued (see
        # ``shutdown``). Periodic lookups are keyed, so a backbone that stops answering holds
        # one thread per kind of lookup, however often the views refresh.
        self.pool = pool or QThreadPool(self)
        if pool is None:
            self.pool.setMaxThreadCount(THREADS)
        self.credentials = credentials or CredentialStore()
        self._replies: set[_Reply] = set()
        self._in_flight: set[str] = set()

    def shutdown(self, wait_ms: int) -> bool:
        """Drop queued lookups and wait up to ``wait_ms`` for running ones (each ends within
        TIMEOUT); True if none is left."""
        self.pool.clear()
        return self.pool.waitForDone(wait_ms)

    def submit(self, fn: Callable[[], Any], on_done: Callable[[Any], None],
               on_error: Callable[[str], None] | None = None, key: str | None = None) -> None:
        """With ``key``, a call while the same lookup is still running is dropped: its answer
        is on the way."""
        if key is not None:
            if key in self._in_flight:
                return
            self._in_flight.add(key)
        reply = _Reply(self)
        self._replies.add(reply)
        # ``finish`` holds what it needs, not ``self``: a reply deleted last must not drop its
        # parent along with it (Qt would delete the reply twice).
        replies, in_flight = self._replies, self._in_flight

        def finish() -> None:
            replies.discard(reply)
            in_flight.discard(key)
            reply.deleteLater()

        reply.done.connect(on_done)
        reply.done.connect(finish)
        reply.failed.connect(on_error or (lambda message: log.warning("%s", message)))
        reply.failed.connect(finish)
        self.pool.start(_Job(fn, reply))

    # --- reading a backbone ---------------------------------------------------------------

    def discover(self, on_done, on_error=None) -> None:
        """Backbones announcing themselves on the LAN (a list of engine.lan LanBackbone)."""
        from engine.lan.discover import discover

        self.submit(lambda: asyncio.run(discover(seconds=DISCOVERY_SECONDS)), on_done, on_error, "discover")

    def health(self, url: str, on_done, on_error) -> None:
        """Checks that ``url`` is a Cotrain backbone; answers with its normalised URL."""
        def check() -> str:
            try:
                backbone_key(url)
            except ValueError as exc:
                raise BackboneUnavailable(str(exc)) from None
            base = url.strip().rstrip("/")
            get(f"{base}/api/health", Health)
            return base

        self.submit(check, on_done, on_error)

    def projects(self, url: str, token: str | None, on_done, on_error) -> None:
        """``(ProjectList, Me or None)`` for one backbone."""
        def fetch() -> tuple[ProjectList, Me | None]:
            projects = get(f"{url}/api/projects", ProjectList)
            me = None
            if token:
                try:
                    me = get(f"{url}/api/me", Me, token)
                except BackboneUnavailable as exc:
                    log.info("no totals from %s: %s", url, exc)
            return projects, me

        self.submit(fetch, on_done, on_error, f"projects {url}")

    def leaderboard(self, url: str, project: str, limit: int, offset: int, by: Ranking, on_done,
                    on_error) -> None:
        query = urllib.parse.urlencode({"limit": limit, "offset": offset, "by": by.value})
        self.submit(lambda: get(f"{url}/api/projects/{project}/leaderboard?{query}", Leaderboard),
                    on_done, on_error)

    def curve(self, url: str, project: str, on_done, on_error) -> None:
        self.submit(lambda: get(f"{url}/api/projects/{project}/curve", Curve), on_done, on_error)

    def me(self, url: str, token: str, on_done, on_error) -> None:
        self.submit(lambda: get(f"{url}/api/me", Me, token), on_done, on_error)

    # --- accounts and the stored login ---------------------------------------------------

    def load_login(self, url: str, on_done, on_error=None) -> None:
        """``(Login or None, where-it-is-kept sentence, whether that is the keyring)``."""
        self.submit(lambda: self.credentials.find(url), on_done, on_error)

    def register(self, url: str, username: str, password: str, on_done, on_error) -> None:
        self._account(lambda: asyncio.run(register(url, username, password)), url, on_done, on_error)

    def log_in(self, url: str, username: str, password: str, on_done, on_error) -> None:
        self._account(lambda: asyncio.run(log_in(url, username, password)), url, on_done, on_error)

    def _account(self, call: Callable[[], Login], url: str, on_done, on_error) -> None:
        store = self.credentials

        def work() -> tuple[Login, str]:
            login = call()
            return login, store.save(url, login)

        self.submit(work, on_done, on_error)

    def log_out(self, url: str, on_done, on_error) -> None:
        """Revokes the token on the backbone when it answers, and forgets it here anyway;
        answers with a note when the backbone could not revoke it."""
        store = self.credentials

        def work() -> str:
            login = store.load(url)
            note = ""
            if login is not None:
                try:
                    asyncio.run(log_out(url, login.token))
                except RuntimeError as exc:
                    note = f"the backbone could not revoke the token ({exc}); forgotten on this computer"
            store.delete(url)
            return note

        self.submit(work, on_done, on_error)
