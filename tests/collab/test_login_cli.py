"""`cotrain register | login | peer | logout` as a person uses them, on a terminal."""

import asyncio
import json
import os
import stat

import aiohttp
import pytest

from engine.paths import engine_command
from tests.collab.harness import running_backbone, tiny_project
from tests.collab.terminal import run_in_terminal

pytestmark = pytest.mark.slow
PASSWORD = "very secret words"


async def test_login_is_kept_used_by_peers_and_revoked_on_logout(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "COTRAIN_HOME": str(home),
           "PYTHON_KEYRING_BACKEND": "keyring.backends.null.Keyring"}
    async with running_backbone(tmp_path / "bb", tiny_project(id="private-lm", require_account=True)) as bb:
        cli = [*engine_command()]

        async def terminal(*args, answers=None):
            return await asyncio.to_thread(run_in_terminal, [*cli, *args], answers or {}, env)

        status, shown = await terminal("register", "--backbone", bb.url, "--username", "alice",
                                       answers={"password:": PASSWORD, "password again:": PASSWORD})
        assert status == 0, shown
        assert PASSWORD not in shown
        assert "logged in to" in shown and "no system keyring" in shown
        saved = home / "credentials.json"
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600

        status, shown = await terminal("login", "--backbone", bb.url, answers={
            "username:": "alice", "password:": "wrong password!"})
        assert status == 1 and "wrong username or password" in shown

        status, shown = await terminal("peer", "--backbone", bb.url, "--project", "private-lm",
                                       "--max-epochs", "2", "--threads", "1")
        assert status == 0, shown
        assert "using the login of alice stored in" in shown and "for alice" in shown

        (login,) = json.loads(saved.read_text()).values()
        token = login["token"]
        status, shown = await terminal("logout", "--backbone", bb.url)
        assert status == 0 and "logged out" in shown
        assert "http://127.0.0.1" not in saved.read_text()
        async with aiohttp.ClientSession() as http, http.get(
                f"{bb.url}/api/me", headers={"Authorization": f"Bearer {token}"}) as resp:
            assert resp.status == 401

        status, shown = await terminal("peer", "--backbone", bb.url, "--project", "private-lm",
                                       "--max-epochs", "1")
        assert status == 1 and "does not accept anonymous peers" in shown
