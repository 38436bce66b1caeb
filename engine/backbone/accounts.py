"""Accounts: password hashing, bearer tokens, and a limit on login attempts.

Passwords are hashed with scrypt (memory-hard) at OWASP's current parameters (N=2^17, r=8,
p=1: 128 MiB and ~0.3 s a hash here); each hash is stored with the parameters that made it,
so a password hashed with older ones is hashed anew at its owner's next log-in. Tokens are
32 random bytes that the backbone stores only as SHA-256 digests, so a leaked database holds
no usable token.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from engine.ratelimit import Sweeps

T = TypeVar("T")


@dataclass(frozen=True)
class Scrypt:
    """scrypt's cost parameters, stored with each hash as ``scrypt:n=...,r=...,p=...``."""

    n: int
    r: int
    p: int

    @property
    def text(self) -> str:
        return f"scrypt:n={self.n},r={self.r},p={self.p}"

    @property
    def maxmem(self) -> int:
        """What OpenSSL needs for these parameters (128·r·(N+p+2) bytes), and a MiB to spare."""
        return 128 * self.r * (self.n + self.p + 2) + (1 << 20)

    @classmethod
    def parse(cls, text: str) -> Scrypt:
        found = re.fullmatch(r"scrypt:n=(\d+),r=(\d+),p=(\d+)", text)
        if found is None:
            raise ValueError(f"unknown password hash parameters {text!r}")
        return cls(*(int(v) for v in found.groups()))


PASSWORD_HASH = Scrypt(n=2**17, r=8, p=1)  # OWASP's guidance for scrypt (2025)
LEGACY_HASH = Scrypt(n=2**14, r=8, p=1)  # what hashes stored before schema 4 were made with


def hash_password(password: str, salt: bytes | None = None,
                  params: Scrypt = PASSWORD_HASH) -> tuple[bytes, bytes]:
    """(salt, digest). Slow on purpose: run it off the event loop (``PasswordWork``)."""
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=params.n, r=params.r, p=params.p, dklen=32,
                            maxmem=params.maxmem)
    return salt, digest


def password_matches(password: str, salt: bytes, digest: bytes, params: Scrypt = PASSWORD_HASH) -> bool:
    return hmac.compare_digest(hash_password(password, salt, params)[1], digest)


class PasswordWork:
    """Where password hashes run: in threads, at most ``at_once`` together (each holds 128 MiB
    while it runs), and one address group's at a time. A group's burst queues behind itself,
    holding at most one of the slots the others wait for, so an honest log-in from elsewhere
    waits at most for hashes already running."""

    def __init__(self, at_once: int) -> None:
        self._slots = asyncio.Semaphore(at_once)
        self._groups: dict[str, tuple[asyncio.Lock, int]] = {}  # group -> (its turn, waiting)

    async def run(self, group: str, work: Callable[..., T], *args: object) -> T:
        lock, waiting = self._groups.get(group, (asyncio.Lock(), 0))
        self._groups[group] = (lock, waiting + 1)
        try:
            async with lock, self._slots:
                return await asyncio.to_thread(work, *args)
        finally:
            lock, waiting = self._groups[group]
            if waiting == 1:
                del self._groups[group]
            else:
                self._groups[group] = (lock, waiting - 1)


def new_token() -> tuple[str, str]:
    """(token for the client, digest to store)."""
    token = secrets.token_urlsafe(32)
    return token, token_digest(token)


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class AttemptLimiter:
    """Attempts allowed per key in a sliding window. An attempt counts from the moment it is
    made (``attempt``) until taken back (``uncount``, ``succeeded``): logins sent all at once
    are all counted before the first is judged."""

    def __init__(self, limit: int, window: float, clock=time.monotonic) -> None:
        self.limit = limit
        self.window = window
        self._clock = clock
        self._attempts: dict[str, deque[float]] = {}
        self._sweeps = Sweeps()

    def retry_after(self, key: str) -> float:
        """Seconds until ``key`` may try again (0 when it may now)."""
        attempts = self._recent(key)
        if len(attempts) < self.limit:
            return 0.0
        return max(attempts[0] + self.window - self._clock(), 0.0)

    def attempt(self, key: str) -> float:
        """Count an attempt now; returns 0, or the seconds to wait (then nothing is counted)."""
        wait = self.retry_after(key)
        if wait == 0:
            self._attempts.setdefault(key, deque()).append(self._clock())
            if self._sweeps.due(len(self._attempts)):
                for stale in [k for k, times in self._attempts.items() if not self._recent_in(times)]:
                    del self._attempts[stale]
                self._sweeps.swept(len(self._attempts))
        return wait

    def succeeded(self, key: str) -> None:
        """The key's owner got in: its failed attempts are forgiven."""
        self._attempts.pop(key, None)

    def uncount(self, key: str) -> None:
        """The attempt just made is not to count after all (a log-in that succeeded, where
        failures are counted, or failed, where successes are); the others still count."""
        attempts = self._attempts.get(key)
        if attempts:
            attempts.pop()

    def _recent_in(self, attempts: deque[float]) -> bool:
        return bool(attempts) and attempts[-1] >= self._clock() - self.window

    def _recent(self, key: str) -> deque[float]:
        attempts = self._attempts.get(key, deque())
        horizon = self._clock() - self.window
        while attempts and attempts[0] < horizon:
            attempts.popleft()
        if not attempts:
            self._attempts.pop(key, None)
        return attempts
