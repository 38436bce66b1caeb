"""Accounts: password hashing, bearer tokens, and a limit on login attempts.

Passwords are hashed with scrypt (memory-hard); tokens are 32 random bytes that the
backbone stores only as SHA-256 digests, so a leaked database holds no usable token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque

from engine.ratelimit import Sweeps

SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32, "maxmem": 64 * 1024 * 1024}


def hash_password(password: str, salt: bytes | None = None) -> tuple[bytes, bytes]:
    """(salt, digest). Slow on purpose (~50 ms): run it off the event loop."""
    salt = salt or secrets.token_bytes(16)
    return salt, hashlib.scrypt(password.encode(), salt=salt, **SCRYPT)


def password_matches(password: str, salt: bytes, digest: bytes) -> bool:
    return hmac.compare_digest(hash_password(password, salt)[1], digest)


def new_token() -> tuple[str, str]:
    """(token for the client, digest to store)."""
    token = secrets.token_urlsafe(32)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AttemptLimiter:
    """Failed logins allowed per key in a sliding window. An attempt counts as a failure
    from the moment it is made (``attempt``) until it succeeds: logins sent all at once are
    all counted before the first is judged."""

    def __init__(self, limit: int, window: float, clock=time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._failures: dict[str, deque[float]] = {}
        self._sweeps = Sweeps()

    def retry_after(self, key: str) -> float:
        """Seconds until ``key`` may try again (0 when it may now)."""
        failures = self._recent(key)
        if len(failures) < self.limit:
            return 0.0
        return max(failures[0] + self.window - self._clock(), 0.0)

    def attempt(self, key: str) -> float:
        """Count an attempt now; returns 0, or the seconds to wait (then nothing is counted)."""
        wait = self.retry_after(key)
        if wait == 0:
            self._failures.setdefault(key, deque()).append(self._clock())
            if self._sweeps.due(len(self._failures)):
                for stale in [k for k, times in self._failures.items() if not self._recent_in(times)]:
                    del self._failures[stale]
                self._sweeps.swept(len(self._failures))
        return wait

    def succeeded(self, key: str) -> None:
        """The key's owner got in: its failures are forgiven."""
        self._failures.pop(key, None)

    def uncount(self, key: str) -> None:
        """The attempt just made succeeded: it is no failure (the others still count)."""
        failures = self._failures.get(key)
        if failures:
            failures.pop()

    def _recent_in(self, failures: deque[float]) -> bool:
        return bool(failures) and failures[-1] >= self._clock() - self.window

    def _recent(self, key: str) -> deque[float]:
        failures = self._failures.get(key, deque())
        horizon = self._clock() - self.window
        while failures and failures[0] < horizon:
            failures.popleft()
        if not failures:
            self._failures.pop(key, None)
        return failures
