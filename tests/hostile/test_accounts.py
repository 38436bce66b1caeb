"""Attacks on accounts, against a backbone started as its owner starts it, from the
attacker's own addresses. Before: concurrent logins bypassed the failure limit and locked
the real owner out; registration had no limit; behind a reverse proxy every user shared the
proxy's address; a token lived for ever and its owner could not see or revoke it."""

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator

import aiohttp
import pytest

from engine.backbone.limits import LimitsConfig
from tests.hostile.adversary import new_address
from tests.hostile.collaboration import Collaboration

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PASSWORD = "correct horse battery"
LIMITS = LimitsConfig()  # what `cotrain backbone` runs with
GUESSES = LIMITS.failed_logins_per_account
REGISTRATIONS = int(LIMITS.registrations_per_address.burst)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    """A backbone alone: accounts need no peers."""
    collaboration = Collaboration(tmp_path_factory.mktemp("accounts"), peers=0)
    try:
        collaboration.start_backbone()
        yield collaboration.url
    finally:
        collaboration.stop()


@contextlib.asynccontextmanager
async def client(address: str = "127.0.0.1",
                 agent: str = "Cotrain test") -> AsyncIterator[aiohttp.ClientSession]:
    """HTTP from ``address`` (a machine of the attacker's, or the owner's own)."""
    connector = aiohttp.TCPConnector(local_addr=(address, 0), limit=0)
    async with aiohttp.ClientSession(connector=connector, headers={"User-Agent": agent}) as http:
        yield http


async def call(http: aiohttp.ClientSession, method: str, url: str, body: dict | None = None,
               headers: dict | None = None) -> tuple[int, dict | str]:
    async with http.request(method, url, json=body, headers=headers) as resp:
        text = await resp.text()
        return resp.status, (await resp.json() if resp.content_type == "application/json" else text)


async def test_guessing_a_password_in_parallel_is_bounded_and_never_locks_the_owner_out(backbone):
    async with client() as owner:
        assert (await call(owner, "POST", f"{backbone}/api/accounts",
                           {"username": "owner", "password": PASSWORD}))[0] == 201
    async with client(new_address()) as attacker:
        guesses = [call(attacker, "POST", f"{backbone}/api/sessions",
                        {"username": "owner", "password": f"guess-{i:04d}"}) for i in range(100)]
        statuses = Counter(status for status, _ in await asyncio.gather(*guesses))
    # Five guesses a minute from one address, all sent at once or not; the rest refused unchecked.
    assert statuses == {401: GUESSES, 429: 100 - GUESSES}, statuses
    async with client() as owner:
        status, reply = await call(owner, "POST", f"{backbone}/api/sessions",
                                   {"username": "owner", "password": PASSWORD})
    assert status == 200 and isinstance(reply, dict) and reply["token"]


async def test_one_address_cannot_make_accounts_without_end(backbone):
    address = new_address()
    async with client(address) as attacker:
        made = await asyncio.gather(*(call(attacker, "POST", f"{backbone}/api/accounts",
                                           {"username": f"sybil-{i:03d}", "password": PASSWORD})
                                      for i in range(40)))
        # Forged X-Forwarded-For headers are nobody's word here: the backbone has no trusted proxy.
        forged = await asyncio.gather(*(call(attacker, "POST", f"{backbone}/api/accounts",
                                             {"username": f"forged-{i:03d}", "password": PASSWORD},
                                             headers={"X-Forwarded-For": f"198.51.100.{i}"})
                                        for i in range(10)))
    statuses = Counter(status for status, _ in made + forged)
    assert statuses == {201: REGISTRATIONS, 429: 50 - REGISTRATIONS}, statuses
    async with client(new_address()) as someone_else:
        status, _ = await call(someone_else, "POST", f"{backbone}/api/accounts",
                               {"username": "newcomer", "password": PASSWORD})
    assert status == 201


async def test_behind_a_trusted_proxy_each_user_is_limited_on_their_own_address(tmp_path):
    """The proxy (127.0.0.1 here) forwards everyone's requests: limits go by the address it
    names in X-Forwarded-For, and only the proxy is believed."""
    proxied = Collaboration(tmp_path, peers=0, backbone_args=("--trusted-proxy", "127.0.0.1"))
    try:
        proxied.start_backbone()
        url = proxied.url
        async with client("127.0.0.1") as proxy:

            async def register(user: str, forwarded_for: str) -> int:
                body = {"username": user, "password": PASSWORD}
                forwarded = {"X-Forwarded-For": f"203.0.113.9, {forwarded_for}"}
                return (await call(proxy, "POST", f"{url}/api/accounts", body, headers=forwarded))[0]

            alice = [await register(f"alice-{i}", "198.51.100.1") for i in range(7)]
            bob = [await register(f"bob-{i}", "198.51.100.2") for i in range(3)]
        assert Counter(alice) == {201: REGISTRATIONS, 429: 7 - REGISTRATIONS} and bob == [201] * 3
        async with client(new_address()) as not_the_proxy:
            spoofed = [(await call(not_the_proxy, "POST", f"{url}/api/accounts",
                                   {"username": f"spoof-{i}", "password": PASSWORD},
                                   headers={"X-Forwarded-For": f"198.51.100.{50 + i}"}))[0] for i in range(7)]
        assert Counter(spoofed) == {201: REGISTRATIONS, 429: 7 - REGISTRATIONS}
    finally:
        proxied.stop()


async def test_a_stolen_token_is_seen_and_revoked_by_its_owner(backbone):
    async with client(agent="Cotrain 0.3 (owner's laptop)") as laptop:
        status, made = await call(laptop, "POST", f"{backbone}/api/accounts",
                                  {"username": "careful", "password": PASSWORD})
        assert status == 201 and isinstance(made, dict)
        mine = {"Authorization": f"Bearer {made['token']}"}
        async with client(new_address(), agent="curl/8.0") as thief:
            status, stolen = await call(thief, "POST", f"{backbone}/api/sessions",
                                        {"username": "careful", "password": PASSWORD})
            assert status == 200 and isinstance(stolen, dict)
            theirs = {"Authorization": f"Bearer {stolen['token']}"}
            assert (await call(thief, "GET", f"{backbone}/api/me", headers=theirs))[0] == 200
            status, listed = await call(laptop, "GET", f"{backbone}/api/sessions", headers=mine)
            assert status == 200 and isinstance(listed, dict)
            sessions = {s["client"]: s for s in listed["sessions"]}
            assert set(sessions) == {"Cotrain 0.3 (owner's laptop)", "curl/8.0"}
            assert sessions["Cotrain 0.3 (owner's laptop)"]["current"]
            days = (sessions["curl/8.0"]["expires"] - sessions["curl/8.0"]["last_used"]) / 86400
            assert days == pytest.approx(90)
            revoked = sessions["curl/8.0"]["id"]
            # Revoked, the thief's token opens nothing, not even a revocation of the owner's.
            status, _ = await call(laptop, "DELETE", f"{backbone}/api/sessions/{revoked}", headers=mine)
            assert status == 200
            assert (await call(thief, "GET", f"{backbone}/api/me", headers=theirs))[0] == 401
            own = sessions["Cotrain 0.3 (owner's laptop)"]["id"]
            assert (await call(thief, "DELETE", f"{backbone}/api/sessions/{own}", headers=theirs))[0] == 401
        assert (await call(laptop, "GET", f"{backbone}/api/me", headers=mine))[0] == 200
