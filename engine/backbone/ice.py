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
import time
from dataclasses import dataclass, field


@dataclass
class IceConfig:
    stun_urls: list[str] = field(default_factory=list)
    turn_urls: list[str] = field(default_factory=list)
    turn_secret: str | None = None
    turn_ttl: int = 6 * 3600  # seconds a TURN credential stays valid
    relay_only: bool = False  # tell every peer to connect through TURN only


def turn_credentials(secret: str, peer_id: str, ttl: int, now: float | None = None) -> tuple[str, str]:
    expiry = int((now if now is not None else time.time()) + ttl)
    username = f"{expiry}:{peer_id}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return username, base64.b64encode(digest).decode()


def ice_servers_for(config: IceConfig, peer_id: str) -> list[dict]:
    servers: list[dict] = []
    if config.stun_urls:
        servers.append({"urls": list(config.stun_urls)})
    if config.turn_urls and config.turn_secret:
        username, credential = turn_credentials(config.turn_secret, peer_id, config.turn_ttl)
        servers.append({"urls": list(config.turn_urls), "username": username, "credential": credential})
    return servers
