"""STUN and TURN servers as the backbone hands them out: in the control plane's
``ice_servers`` message and in the REST answers that set up a peer's links."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from engine.wire.types import Name, Url


class IceServer(Struct, kw_only=True, omit_defaults=True):
    """A STUN or TURN server as RTCIceServer takes it."""

    urls: Annotated[list[Url], Meta(min_length=1, max_length=16)]
    username: Name | None = None
    credential: Annotated[str, Meta(max_length=256)] | None = None


IceServerList = Annotated[list[IceServer], Meta(max_length=16)]
