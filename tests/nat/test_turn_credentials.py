"""coturn accepts the backbone's time-limited credentials and refuses expired or forged ones."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from engine.backbone.ice import turn_credentials
from tests.nat.services import REPO, TURN_PORT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


async def allocate(network, username: str, password: str) -> dict:
    process = await asyncio.create_subprocess_exec(
        *network.cone.prefix(), sys.executable, "-m", "tests.nat.turn_allocate", network.public.address,
        str(TURN_PORT), username, password, stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 60)
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_issued_credentials_get_a_relay(network):
    result = await allocate(network, *turn_credentials(network.secret, "peer-1", ttl=600))
    assert result["ok"], result
    assert result["relayed"][0] == network.public.address


async def test_expired_credentials_are_refused(network):
    issued_long_ago = time.time() - 7200
    credentials = turn_credentials(network.secret, "peer-1", ttl=600, now=issued_long_ago)
    result = await allocate(network, *credentials)
    assert not result["ok"] and "401" in result["error"], result


async def test_credentials_signed_with_another_secret_are_refused(network):
    result = await allocate(network, *turn_credentials("not-the-secret", "peer-1", ttl=600))
    assert not result["ok"] and "401" in result["error"], result


async def test_a_valid_username_with_a_tampered_expiry_is_refused(network):
    username, password = turn_credentials(network.secret, "peer-1", ttl=600)
    expiry, peer = username.split(":", 1)
    result = await allocate(network, f"{int(expiry) + 86400}:{peer}", password)
    assert not result["ok"] and "401" in result["error"], result
