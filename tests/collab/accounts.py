"""Creating users on a running backbone, for ledger tests."""

from __future__ import annotations

import aiohttp


async def register(url: str, username: str, password: str = "correct horse battery") -> str:
    async with aiohttp.ClientSession() as http, http.post(
        f"{url}/api/accounts", json={"username": username, "password": password}
    ) as resp:
        assert resp.status == 201, await resp.text()
        return (await resp.json())["token"]


async def get_json(url: str, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()
