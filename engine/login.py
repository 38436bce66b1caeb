"""Account calls to a backbone (register, log in, log out), shared by the CLI and the app."""

from __future__ import annotations

import aiohttp

from engine.credentials import Login


class AccountError(RuntimeError):
    """The backbone refused; the message is the backbone's reason."""


async def _call(method: str, url: str, json: dict | None = None, token: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http, \
                http.request(method, url, json=json, headers=headers) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError:
                body = {}
            if resp.status >= 400:
                reason = body.get("error") if isinstance(body, dict) else None
                raise AccountError(reason or f"the backbone answered {resp.status}")
            return body if isinstance(body, dict) else {}
    except aiohttp.ClientError as exc:
        raise AccountError(f"cannot reach the backbone: {exc}") from None


async def register(backbone: str, username: str, password: str) -> Login:
    body = await _call("POST", f"{backbone.rstrip('/')}/api/accounts",
                       {"username": username, "password": password})
    return Login(body["username"], body["token"])


async def log_in(backbone: str, username: str, password: str) -> Login:
    body = await _call("POST", f"{backbone.rstrip('/')}/api/sessions",
                       {"username": username, "password": password})
    return Login(body["username"], body["token"])


async def log_out(backbone: str, token: str) -> None:
    await _call("DELETE", f"{backbone.rstrip('/')}/api/sessions", token=token)
