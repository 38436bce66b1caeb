"""The peer's control plane: HTTP and one WebSocket to the backbone."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import aiohttp

from engine import __version__
from engine.project import ProjectSpec
from engine.transport.shaping import RateLimiter
from engine.wire import ProtocolError
from engine.wire.messages import CONTROL_TYPES, CheckpointInfo, decode, encode
from engine.wire.schema import from_dict

log = logging.getLogger(__name__)
PEER_TOKEN_HEADER = "X-Cotrain-Peer-Token"
PEER_ID_HEADER = "X-Cotrain-Peer-Id"
Progress = Callable[[int, int], None]


class BackboneError(RuntimeError):
    """The backbone refused or could not be reached; the message says why. ``fatal``: trying
    again will not help (the backbone no longer knows this peer, or refuses its login)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


@dataclass
class JoinReply:
    peer_id: str
    token: str
    project: ProjectSpec
    ice_servers: list[dict] = field(default_factory=list)
    ice_policy: str = "all"  # "relay": connect through TURN only
    report_interval: float = 0.5
    max_checkpoint_bytes: int = 1 << 30
    username: str | None = None


class BackboneClient:
    def __init__(self, base_url: str, project_id: str, name: str,
                 user_token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.project_id = project_id
        self.name = name
        self.user_token = user_token
        self.join_reply: JoinReply | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self.upload = RateLimiter()
        self.download = RateLimiter()

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"cotrain/{__version__}"}
        if self.user_token:
            headers["Authorization"] = f"Bearer {self.user_token}"
        if self.join_reply:
            headers[PEER_TOKEN_HEADER] = self.join_reply.token
            headers[PEER_ID_HEADER] = self.join_reply.peer_id
        return headers

    async def join(self) -> JoinReply:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        url = f"{self.base_url}/api/projects/{self.project_id}/peers"
        try:
            async with self._http.post(url, json={"name": self.name, "version": __version__},
                                       headers=self._headers()) as resp:
                body = await _json_or_error(resp)
        except aiohttp.ClientError as exc:
            raise BackboneError(f"cannot reach the backbone at {self.base_url}: {exc}") from None
        try:
            self.join_reply = from_dict(JoinReply, body, "join reply")
        except ProtocolError as exc:
            raise BackboneError(f"the backbone's answer makes no sense: {exc}") from None
        await self.connect()
        return self.join_reply

    async def connect(self) -> None:
        """Open the control socket of the peer we joined as."""
        assert self._http is not None and self.join_reply is not None
        url = f"{self.base_url}/api/projects/{self.project_id}/peers/{self.join_reply.peer_id}/ws"
        try:
            self._ws = await self._http.ws_connect(url, headers=self._headers(), heartbeat=15,
                                                   max_msg_size=1 << 20)
        except aiohttp.WSServerHandshakeError as exc:
            raise BackboneError(f"the backbone refused the control connection ({exc.status}: "
                                f"{exc.message})", fatal=exc.status in (401, 403, 404)) from None
        except (aiohttp.ClientError, OSError) as exc:
            raise BackboneError(f"cannot open the control connection: {exc}") from None

    async def reconnect(self, stopping: asyncio.Event, give_up_after: float) -> None:
        """Reopen the control socket with growing pauses, e.g. while the backbone restarts."""
        deadline = time.monotonic() + give_up_after
        delay = 0.5
        while True:
            try:
                await self.connect()
                return
            except BackboneError as exc:
                if exc.fatal or time.monotonic() + delay > deadline:
                    raise
                log.info("backbone unreachable (%s); retrying in %.0fs", exc, delay)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            if stopping.is_set():
                raise BackboneError("stopped while reconnecting")
            delay = min(delay * 2, 10.0)

    async def send(self, msg: object) -> bool:
        """Send a control message; False (and nothing raised) while disconnected: what a peer
        reports is state that it reports again once reconnected."""
        if self._ws is None or self._ws.closed:
            log.debug("not connected; dropping %s", type(msg).__name__)
            return False
        try:
            await self._ws.send_str(encode(msg))
        except (ConnectionError, RuntimeError) as exc:
            log.debug("could not send %s: %s", type(msg).__name__, exc)
            return False
        return True

    async def messages(self) -> AsyncIterator[object]:
        """Control messages from the backbone until the connection ends; bad ones are logged."""
        assert self._ws is not None
        async for raw in self._ws:
            if raw.type != aiohttp.WSMsgType.TEXT:
                break
            try:
                yield decode(raw.data, CONTROL_TYPES)
            except ProtocolError as exc:
                log.warning("ignoring a bad message from the backbone: %s", exc)

    @property
    def close_reason(self) -> str:
        if self._ws is None:
            return "never connected"
        code = self._ws.close_code
        return f"code {code}" if code is not None else "connection lost"

    async def upload_checkpoint(self, epoch: int, data: bytes, params_sha256: str) -> None:
        assert self._http is not None
        url = f"{self.base_url}/api/projects/{self.project_id}/checkpoints/{epoch}"
        headers = {**self._headers(), "X-Content-SHA256": hashlib.sha256(data).hexdigest(),
                   "X-Params-SHA256": params_sha256, "Content-Type": "application/octet-stream"}
        async def chunks():
            for start in range(0, len(data), 1 << 16):
                piece = data[start : start + (1 << 16)]
                await self.upload.acquire(len(piece))
                yield piece

        async with self._http.put(url, data=chunks(), headers=headers) as resp:
            await _json_or_error(resp)

    async def download_checkpoint(self, info: CheckpointInfo, progress: Progress | None = None) -> bytes:
        """The checkpoint's bytes, verified against its sha256."""
        assert self._http is not None and self.join_reply is not None
        if info.size > self.join_reply.max_checkpoint_bytes:
            raise BackboneError(f"checkpoint of {info.size} bytes is larger than allowed")
        url = f"{self.base_url}{info.url}" if info.url.startswith("/") else info.url
        buffer = bytearray()
        digest = hashlib.sha256()
        async with self._http.get(url, headers=self._headers()) as resp:
            if resp.status != 200:
                await _json_or_error(resp)
            async for chunk in resp.content.iter_chunked(1 << 16):
                await self.download.acquire(len(chunk))  # reading slower slows the sender
                buffer += chunk
                digest.update(chunk)
                if len(buffer) > info.size:
                    raise BackboneError("checkpoint is larger than announced")
                if progress:
                    progress(len(buffer), info.size)
        if digest.hexdigest() != info.sha256:
            raise BackboneError("checkpoint checksum does not match")
        return bytes(buffer)

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()


async def _json_or_error(resp: aiohttp.ClientResponse) -> dict:
    try:
        body = await resp.json(content_type=None)
    except ValueError:
        body = None
    if resp.status >= 400:
        reason = body.get("error") if isinstance(body, dict) else None
        raise BackboneError(f"backbone said {resp.status}: {reason or resp.reason}")
    if not isinstance(body, dict):
        raise BackboneError("backbone sent something that is not a JSON object")
    return body
