"""A backbone's address as people type it: checked once, spelled one way."""

from __future__ import annotations

from urllib.parse import urlsplit


def backbone_key(url: str) -> str:
    """One spelling per backbone, ``scheme://host:port`` in lower case without a path; a
    ValueError saying what is wrong with anything else (no scheme, a port past 65535)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not a backbone address: {url!r} (expected http://host:port)")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"{url!r} has no valid port (1 to 65535)") from None
    if port == 0:
        raise ValueError(f"{url!r} has no valid port (1 to 65535)")
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"
