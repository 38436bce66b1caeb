"""Log-in limits (on a controllable clock), password hash parameters, and the queue password
hashes wait in."""

import asyncio
import threading

import pytest

from engine.backbone.accounts import LEGACY_HASH, PASSWORD_HASH, PasswordWork, Scrypt, password_matches
from engine.backbone.logins import LoginLimits
from engine.backbone.rate_limits import LimitsConfig
from tests.conftest import until
from tests.unit.tracker_helpers import Clock

LIMITS = LimitsConfig()


def log_in(limits: LoginLimits, account: str, group: str, right: bool) -> str:
    """One log-in judged at once: 'ok', 'wrong', or 'refused' (429)."""
    if limits.begin(account, group):
        return "refused"
    if not right:
        return "wrong"
    return "refused" if limits.succeeded(account, group) else "ok"


def test_successful_logins_are_limited_per_account_across_addresses():
    limits = LoginLimits(LIMITS, Clock())
    outcomes = [log_in(limits, "alice", f"198.51.100.{i % 4}", True) for i in range(40)]
    assert outcomes.count("ok") == LIMITS.logins_per_account


def test_logins_from_one_address_come_a_few_at_once_then_at_a_steady_rate_whatever_the_accounts():
    clock = Clock()
    limits = LoginLimits(LIMITS, clock)
    burst, rate = int(LIMITS.logins_per_address.burst), LIMITS.logins_per_address.per_second
    outcomes = [log_in(limits, f"user-{i % 5}", "198.51.100.1", True) for i in range(100)]
    assert outcomes.count("ok") == burst
    assert log_in(limits, "user-0", "198.51.100.2", True) == "ok", "other addresses are not limited"
    clock.now += 1 / rate
    after_a_pause = [log_in(limits, "user-1", "198.51.100.1", True) for _ in range(3)]
    assert after_a_pause == ["ok", "refused", "refused"]
    clock.now += 1 / rate
    assert log_in(limits, "user-2", "198.51.100.1", False) == "wrong", "wrong or right, each counts"
    assert log_in(limits, "user-2", "198.51.100.1", True) == "refused"


def test_logins_sent_all_at_once_are_counted_before_any_is_judged():
    limits = LoginLimits(LIMITS, Clock())
    admitted = [limits.begin(f"user-{i % 10}", "198.51.100.1") == 0 for i in range(100)]
    assert sum(admitted) == LIMITS.logins_per_address.burst


def test_a_guesser_elsewhere_neither_locks_the_owner_out_nor_uses_up_their_logins():
    limits = LoginLimits(LIMITS, Clock())
    guesses = [log_in(limits, "owner", f"203.0.113.{i}", False) for i in range(50)]
    assert set(guesses) == {"wrong"}
    burst = [log_in(limits, "owner", "203.0.113.1", False) for _ in range(10)]
    assert burst.count("wrong") == LIMITS.failed_logins_per_account - 1
    assert log_in(limits, "owner", "198.51.100.9", True) == "ok"


def test_hash_parameters_are_stored_with_each_hash_and_read_back():
    assert Scrypt.parse(PASSWORD_HASH.text) == PASSWORD_HASH == Scrypt(2**17, 8, 1)
    assert Scrypt.parse("scrypt:n=16384,r=8,p=1") == LEGACY_HASH
    assert PASSWORD_HASH.maxmem > 128 * 8 * 2**17
    with pytest.raises(ValueError):
        Scrypt.parse("bcrypt:12")


def test_a_hash_checks_only_with_the_parameters_that_made_it():
    from engine.backbone.accounts import hash_password

    salt, digest = hash_password("pass-word", params=LEGACY_HASH)
    assert password_matches("pass-word", salt, digest, LEGACY_HASH)
    assert not password_matches("pass-word", salt, digest, PASSWORD_HASH)
    assert not password_matches("password", salt, digest, LEGACY_HASH)


async def test_one_address_burst_waits_behind_itself_never_in_front_of_others():
    """Two hashes at once; the flooding group holds at most one of them, so a log-in from
    elsewhere starts as soon as it arrives."""
    work = PasswordWork(at_once=2)
    release = threading.Event()
    started: list[str] = []

    def hash_(who: str) -> str:
        started.append(who)
        release.wait(10)
        return who

    flood = [asyncio.ensure_future(work.run("flooder", hash_, f"flood-{i}")) for i in range(10)]
    honest = asyncio.ensure_future(work.run("honest", hash_, "honest"))
    await until(lambda: len(started) >= 2, 10, "two hashes to start")
    assert sorted(started) == ["flood-0", "honest"]
    release.set()
    assert await honest == "honest"
    assert await asyncio.gather(*flood) == [f"flood-{i}" for i in range(10)]
    assert work._groups == {}, "a group's turn is forgotten once nobody waits for it"
