"""The peer's control plane: HTTP and one WebSocket to the backbone."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

import aiohttp

from engine import __version__
from engine.aio import finished_within
from engine.backoff import Backoff
from engine.problems import unreachable, where
from engine.transport.shaping import RateLimiter
from engine.wire import WIRE_VERSION, ProtocolError
from engine.wire.codec import Codec, encode, encode_text
from engine.wire.control import (
    BackboneMessage,
    CheckpointInfo,
    ControlMessage,
    from_backbone,
    version_mismatch,
)
from engine.wire.rest import (
    CONTENT_SHA256_HEADER,
    MAX_REPLY,
    PEER_ID_HEADER,
    PEER_TOKEN_HEADER,
    PROBE_BYTES,
    STATE_SHA256_HEADER,
    ErrorReply,
    JoinReply,
    JoinRequest,
    ProbeReply,
    reply_codec,
)
from engine.wire.types import PeerRole

log = logging.getLogger(__name__)
RECONNECT_FIRST = 1.0  # seconds: the first pause is 0.5-1 s
RECONNECT_CAP = 60.0
STABLE = 30.0  # a connection that lasted this long forgives the failures before it
# Every request gives up when the backbone stays silent this long between bytes (one that
# accepts a connection and never answers held a peer for minutes), and the control socket's
# handshake within HANDSHAKE_TIMEOUT; the open socket is watched by heartbeats instead.
READ_TIMEOUT = 15.0
REQUEST = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=READ_TIMEOUT)
HANDSHAKE_TIMEOUT = 15.0
KEEP_IDLE = 5.0  # seconds an idle HTTP connection is kept for reuse
DownloadProgress = Callable[[int, int], None]
T = TypeVar("T")
_join_reply: Codec[JoinReply] = reply_codec(JoinReply)
_checkpoint: Codec[CheckpointInfo] = reply_codec(CheckpointInfo)
_error: Codec[ErrorReply] = reply_codec(ErrorReply)
_probe: Codec[ProbeReply] = reply_codec(ProbeReply)


class BackboneError(RuntimeError):
    """The backbone refused or could not be reached; the message says why. ``fatal``: trying
    again will not help (the backbone no longer knows this peer, or refuses its login).
    ``rejoin``: the project changed since this peer joined; a new peer joins its new version."""

    def __init__(self, message: str, fatal: bool = False, rejoin: bool = False) -> None:
        super().__init__(message)
        self.fatal, self.rejoin = fatal, rejoin


PROJECT_CHANGED = "the project changed: joining it again"  # why a peer stops to rejoin


class ControlClient:
    """One peer's line to its backbone: joining, the control socket, checkpoints."""

    def __init__(self, base_url: str, project_id: str, name: str,
                 user_token: str | None = None, local_address: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.local_address = local_address  # the address to connect from, on a machine with several
        self.project_id = project_id
        self.name = name
        self.user_token = user_token
        self.join_reply: JoinReply | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self.upload = RateLimiter()
        self.download = RateLimiter()
        self.backoff = Backoff(RECONNECT_FIRST, RECONNECT_CAP)
        self.connect_attempts = 0
        self._connected_at = 0.0

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": f"cotrain/{__version__}", "Content-Type": "application/json"}
        if self.user_token:
            headers["Authorization"] = f"Bearer {self.user_token}"
        if self.join_reply:
            headers[PEER_TOKEN_HEADER] = self.join_reply.token
            headers[PEER_ID_HEADER] = self.join_reply.peer_id
        return headers

    def file_headers(self) -> dict[str, str]:
        """What a download of the project's files presents (it may require an account)."""
        return {k: v for k, v in self._headers().items() if k != "Content-Type"}

    async def join(self, role: PeerRole = PeerRole.TRAINER) -> JoinReply:
        if self._http is None:
            local = (self.local_address, 0) if self.local_address else None
            # The backbone closes a connection idle for 10 s: never reuse one idle longer.
            connector = aiohttp.TCPConnector(local_addr=local, keepalive_timeout=KEEP_IDLE)
            self._http = aiohttp.ClientSession(connector=connector,
                                               timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        url = f"{self.base_url}/api/projects/{self.project_id}/peers"
        request = JoinRequest(name=self.name, version=__version__, wire=WIRE_VERSION, role=role)
        try:
            async with self._http.post(url, data=encode(request), headers=self._headers(),
                                       timeout=REQUEST) as resp:
                reply = await _answer(resp, _join_reply)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.info("join failed: %r", exc)
            raise BackboneError(unreachable(self.base_url, exc)) from None
        if reply.wire_version != WIRE_VERSION:
            raise BackboneError(version_mismatch(peer=WIRE_VERSION, backbone=reply.wire_version), fatal=True)
        self.join_reply = reply
        await self.connect()
        return reply

    async def connect(self) -> None:
        """Open the control socket of the peer we joined as."""
        assert self._http is not None and self.join_reply is not None
        url = f"{self.base_url}/api/projects/{self.project_id}/peers/{self.join_reply.peer_id}/ws"
        self.connect_attempts += 1
        try:
            # A backbone that accepts the connection and never answers must not hold us.
            self._ws = await asyncio.wait_for(self._http.ws_connect(
                url, headers=self._headers(), heartbeat=15, max_msg_size=1 << 20), HANDSHAKE_TIMEOUT)
            self._connected_at = time.monotonic()
        except aiohttp.WSServerHandshakeError as exc:
            raise BackboneError(f"the backbone refused the control connection ({exc.status}: "
                                f"{exc.message})", fatal=exc.status in (401, 403, 404),
                                rejoin=exc.status == 410) from None
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.info("control connection failed: %r", exc)
            raise BackboneError(unreachable(self.base_url, exc)) from None

    async def reconnect(self, stopping: asyncio.Event, give_up_after: float,
                        waiting: Callable[[float, str], None] | None = None) -> None:
        """Reopen the control socket after it closed, with growing, jittered pauses (a
        backbone that restarts is not stormed by its peers). The pauses start over only
        once a connection has lasted STABLE seconds: one refused just after it opened
        keeps backing off. ``waiting(seconds, why)`` hears of each pause."""
        if time.monotonic() - self._connected_at > STABLE:
            self.backoff.reset()
        deadline = time.monotonic() + give_up_after
        why = f"Lost the backbone at {where(self.base_url)}."
        while True:
            delay = self.backoff.next()
            if time.monotonic() + delay > deadline:
                raise BackboneError(f"the backbone stayed unreachable for {give_up_after:.0f} s")
            if waiting is not None:
                waiting(delay, why)
            await finished_within(stopping.wait(), delay)
            if stopping.is_set():
                raise BackboneError("stopped while reconnecting")
            try:
                await self.connect()
                return
            except BackboneError as exc:
                if exc.fatal or exc.rejoin:
                    raise
                why = str(exc)
                log.info("backbone unreachable (%s); trying again", exc)

    @property
    def connected(self) -> bool:
        """Whether the control socket is open."""
        return self._ws is not None and not self._ws.closed

    async def send(self, msg: ControlMessage) -> bool:
        """Send a control message; False (and nothing raised) while disconnected: what a peer
        reports is state that it reports again once reconnected."""
        if self._ws is None or self._ws.closed:
            log.debug("not connected; dropping %s", type(msg).__name__)
            return False
        try:
            await self._ws.send_str(encode_text(msg))
        except (ConnectionError, RuntimeError) as exc:
            log.debug("could not send %s: %s", type(msg).__name__, exc)
            return False
        return True

    async def messages(self) -> AsyncIterator[BackboneMessage]:
        """Control messages from the backbone until the connection ends; bad ones are logged."""
        ws = self._ws
        assert ws is not None
        try:
            async for raw in ws:
                if raw.type != aiohttp.WSMsgType.TEXT:
                    break
                try:
                    yield from_backbone.decode(raw.data)
                except ProtocolError as exc:
                    log.warning("ignoring a bad message from the backbone: %s", exc)
        except (aiohttp.ClientError, ConnectionError) as exc:
            # (aiohttp answers a ping as it reads it: on a socket closing under it, that
            # write raises, where a close reads as the end of the messages)
            log.info("the control connection broke: %s", exc)
            with contextlib.suppress(aiohttp.ClientError, OSError):
                await ws.close()

    @property
    def close_reason(self) -> str:
        if self._ws is None:
            return "never connected"
        code = self._ws.close_code
        return f"code {code}" if code is not None else "connection lost"

    async def upload_checkpoint(self, epoch: int, data: bytes, state_sha256: str) -> None:
        assert self._http is not None
        url = f"{self.base_url}/api/projects/{self.project_id}/checkpoints/{epoch}"
        headers = {**self._headers(), CONTENT_SHA256_HEADER: hashlib.sha256(data).hexdigest(),
                   STATE_SHA256_HEADER: state_sha256, "Content-Type": "application/octet-stream"}
        async def chunks():
            for start in range(0, len(data), 1 << 16):
                piece = data[start : start + (1 << 16)]
                await self.upload.acquire(len(piece))
                yield piece

        with _transfer_errors("checkpoint upload"):
            async with self._http.put(url, data=chunks(), headers=headers, timeout=REQUEST) as resp:
                await _answer(resp, _checkpoint)

    async def download_checkpoint(self, info: CheckpointInfo,
                                  progress: DownloadProgress | None = None) -> bytes:
        """The checkpoint's bytes, verified against its sha256."""
        assert self._http is not None and self.join_reply is not None
        if info.size > self.join_reply.max_checkpoint_bytes:
            raise BackboneError(f"checkpoint of {info.size} bytes is larger than allowed")
        url = f"{self.base_url}{info.url}" if info.url.startswith("/") else info.url
        buffer = bytearray()
        digest = hashlib.sha256()
        with _transfer_errors("checkpoint download"):
            async with self._http.get(url, headers=self._headers(), timeout=REQUEST) as resp:
                if resp.status != 200:
                    await _answer(resp, _error)
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

    async def probe_upload(self, seconds: float) -> float:
        """Bytes per second this peer uploads to the backbone, timed until the backbone has
        taken them all (so bytes still queued in the kernel count against the time)."""
        assert self._http is not None
        url = f"{self.base_url}/api/projects/{self.project_id}/probe"
        headers = {**self._headers(), "Content-Type": "application/octet-stream"}
        block = bytes(range(256)) * 256
        began = time.monotonic()

        async def chunks() -> AsyncIterator[bytes]:
            sent = 0
            while sent + len(block) <= PROBE_BYTES and time.monotonic() - began < seconds:
                await self.upload.acquire(len(block))
                sent += len(block)
                yield block

        try:
            async with self._http.post(url, data=chunks(), headers=headers, timeout=REQUEST) as resp:
                reply = await _answer(resp, _probe)
        except aiohttp.ClientError as exc:
            raise BackboneError(f"link probe failed: {exc}") from None
        return reply.received / max(time.monotonic() - began, 1e-3)

    async def probe_download(self, seconds: float) -> float:
        """Bytes per second this peer downloads from the backbone, from the first byte on."""
        assert self._http is not None
        url = f"{self.base_url}/api/projects/{self.project_id}/probe?bytes={PROBE_BYTES}"
        received, first = 0, None
        try:
            async with self._http.get(url, headers=self._headers(), timeout=REQUEST) as resp:
                if resp.status != 200:
                    await _answer(resp, _error)
                async for chunk in resp.content.iter_chunked(1 << 16):
                    await self.download.acquire(len(chunk))
                    now = time.monotonic()
                    if first is None:
                        first = now
                    else:
                        received += len(chunk)
                    if now - first >= seconds:
                        break
        except aiohttp.ClientError as exc:
            raise BackboneError(f"link probe failed: {exc}") from None
        if first is None or received == 0:
            raise BackboneError("link probe received nothing")
        return received / max(time.monotonic() - first, 1e-3)

    async def close(self) -> None:
        if self._ws is not None:
            with contextlib.suppress(aiohttp.ClientError, OSError):  # (a connection already gone)
                await self._ws.close()
        if self._http is not None:
            await self._http.close()


@contextlib.contextmanager
def _transfer_errors(what: str) -> Iterator[None]:
    """A connection that breaks mid-transfer is the backbone's trouble, said as such: the
    caller retries later, and no transport error ends a peer."""
    try:
        yield
    except (aiohttp.ClientError, OSError) as exc:
        raise BackboneError(f"{what} failed: {exc or type(exc).__name__}") from None


async def _answer(resp: aiohttp.ClientResponse, codec: Codec[T]) -> T:
    """The answer as ``codec`` reads it, or BackboneError with the backbone's reason."""
    raw = await resp.content.read(MAX_REPLY)
    if resp.status >= 400:
        try:
            reason = _error.decode(raw).error
        except ProtocolError:
            reason = resp.reason or ""
        raise BackboneError(f"backbone said {resp.status}: {reason}")
    try:
        return codec.decode(raw)
    except ProtocolError as exc:
        raise BackboneError(f"the backbone's answer makes no sense: {exc}") from None
