"""How many log-ins the backbone checks, per account and per address group.

Every log-in costs a password hash (128 MiB, ~0.3 s) and, when it succeeds, a token row. Per
address group, every log-in counts, right or wrong, as it arrives (before the slow hash: those
sent all at once are all counted), at a steady rate with a small burst, so one address takes
a bounded share of the hashing and an honest log-in from elsewhere seldom waits behind its
hashes. Failures count per (account, group) too, so a guesser elsewhere cannot lock the
owner out; successes per account, which only someone holding the password can spend. Pure,
with a clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.backbone.accounts import AttemptLimiter
from engine.backbone.rate_limits import LimitsConfig
from engine.ratelimit import Buckets

WINDOW = 60.0  # seconds the per-account limits count over


class LoginLimits:
    def __init__(self, config: LimitsConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self._failed_pair = AttemptLimiter(config.failed_logins_per_account, WINDOW, clock)
        self._by_group = Buckets(config.logins_per_address, clock)
        self._succeeded_account = AttemptLimiter(config.logins_per_account, WINDOW, clock)

    def begin(self, account: str, group: str) -> float:
        """A log-in to ``account`` (case-folded) from ``group`` arrives: 0 if its password may be
        checked (it is counted against the group, and as a failure until it succeeds), or the
        seconds to wait (nothing counted)."""
        pair = _pair(account, group)
        wait = max(self._failed_pair.retry_after(pair), self._by_group.wait(group),
                   self._succeeded_account.retry_after(account))
        if wait == 0:
            self._failed_pair.attempt(pair)
            self._by_group.take(group)
        return wait

    def succeeded(self, account: str, group: str) -> float:
        """The password was right: 0 if a token may be given (the success is counted against
        the account), or the seconds until the account may log in again."""
        self._failed_pair.succeeded(_pair(account, group))
        return self._succeeded_account.attempt(account)


def _pair(account: str, group: str) -> str:
    return f"{account}\0{group}"
