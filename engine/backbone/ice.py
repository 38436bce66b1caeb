"""ICE servers handed to each joining peer: STUN, and TURN with credentials that expire.

TURN credentials follow coturn's shared-secret scheme (``use-auth-secret``, the "TURN REST
API"): the username is ``<expiry unix time>:<peer id>`` and the password is
base64(HMAC-SHA1(secret, username)). The backbone and coturn share the secret; no peer ever
sees it, and a leaked credential stops working at its expiry.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.wire.ice_servers import IceServer


@dataclass
class IceConfig:
    stun_urls: list[str] = field(default_factory=list)
    turn_urls: list[str] = field(default_factory=list)
    turn_secret: str | None = None
    turn_ttl: int = 6 * 3600  # seconds a TURN credential stays valid
    relay_only: bool = False  # tell every peer to connect through TURN only

    def validate(self) -> None:
        for url in self.stun_urls:
            if not url.startswith("stun:") and not url.startswith("stuns:"):
                raise ValueError(f"not a STUN URL: {url!r} (expected stun:HOST[:PORT])")
        for url in self.turn_urls:
            if not url.startswith("turn:") and not url.startswith("turns:"):
                raise ValueError(f"not a TURN URL: {url!r} (expected turn:HOST[:PORT])")
        if self.turn_urls and not self.turn_secret:
            raise ValueError("TURN servers need the shared secret "
                             "(--turn-secret-file or COTRAIN_TURN_SECRET)")
        if self.relay_only and not self.turn_urls:
            raise ValueError("relay-only needs a TURN server")
        if self.turn_ttl < 60:
            raise ValueError("TURN credentials must stay valid for at least 60 seconds")


def read_turn_secret(path: Path | None) -> str | None:
    """The secret from a file (kept out of the process list) or the environment."""
    if path is not None:
        secret = path.read_text().strip()
        if not secret:
            raise ValueError(f"{path} is empty")
        return secret
    return os.environ.get("COTRAIN_TURN_SECRET") or None


def turn_credentials(secret: str, peer_id: str, ttl: int, now: float | None = None) -> tuple[str, str]:
    expiry = int((now if now is not None else time.time()) + ttl)
    username = f"{expiry}:{peer_id}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def ice_servers_for(config: IceConfig, peer_id: str, now: float | None = None) -> list[IceServer]:
    servers: list[IceServer] = []
    if config.stun_urls:
        servers.append(IceServer(urls=list(config.stun_urls)))
    if config.turn_urls and config.turn_secret:
        username, credential = turn_credentials(config.turn_secret, peer_id, config.turn_ttl, now)
        servers.append(IceServer(urls=list(config.turn_urls), username=username, credential=credential))
    return servers
