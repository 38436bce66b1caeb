"""Data-plane framing: a JSON header plus raw payload bytes, cut into data-channel messages.

aiortc delivers at most 256 KiB per data-channel message, while a gradient part or a
training state is tens of megabytes. Every chunk names its message id, so several
messages may interleave on one ordered channel and still be put back together.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.wire import WIRE_VERSION, ProtocolError
from engine.wire.codec import encode as encode_header
from engine.wire.frames import MAX_HEADER, Header, headers

MAX_CHUNK = 256 * 1024
MAGIC = b"CT"
FLAG_FIRST = 1
FLAG_LAST = 2

_FIRST = struct.Struct("!2sBBIIQ")  # magic, version, flags, msg_id, header_len, payload_len
_NEXT = struct.Struct("!2sBBI")  # magic, version, flags, msg_id


@dataclass
class Frame:
    """One reassembled message."""

    header: Header
    payload: bytes | bytearray = b""


def encode(msg_id: int, header: Header, payload: bytes | bytearray | memoryview = b"") -> Iterator[bytes]:
    """Yield the chunks of one message, each at most MAX_CHUNK bytes."""
    head = encode_header(header)
    if len(head) > MAX_HEADER:
        raise ValueError(f"frame header of {len(head)} bytes exceeds {MAX_HEADER}")
    view = memoryview(payload).cast("B")
    total = len(view)
    room = MAX_CHUNK - _FIRST.size - len(head)
    first = view[:room]
    flags = FLAG_FIRST | (FLAG_LAST if len(first) == total else 0)
    yield _FIRST.pack(MAGIC, WIRE_VERSION, flags, msg_id, len(head), total) + head + first
    offset = len(first)
    room = MAX_CHUNK - _NEXT.size
    while offset < total:
        part = view[offset : offset + room]
        offset += len(part)
        flags = FLAG_LAST if offset == total else 0
        yield _NEXT.pack(MAGIC, WIRE_VERSION, flags, msg_id) + part


@dataclass
class _Partial:
    header: Header
    expected: int
    buffer: bytearray = field(default_factory=bytearray)


@dataclass
class Incoming:
    """A message still arriving: enough to show a progress bar."""

    msg_id: int
    header: Header
    received: int
    expected: int


class Reassembler:
    """Puts chunks back into frames; any violation raises ProtocolError.

    A peer that declares a huge payload gets no memory up front: buffers grow with the
    bytes that really arrive. Each message is capped at ``max_payload`` (sized from the
    model's state by the peer), at most ``max_open`` messages may be under way at once
    (a round needs a part and a result, a join a state), and together they may hold at
    most ``max_buffered`` bytes.
    """

    def __init__(self, max_payload: int, max_open: int = 4, max_buffered: int | None = None) -> None:
        self.max_payload = max_payload
        self.max_open = max_open
        self.max_buffered = 2 * max_payload if max_buffered is None else max_buffered
        self._open: dict[int, _Partial] = {}
        self._buffered = 0

    @property
    def open(self) -> int:
        """Messages begun and not yet complete."""
        return len(self._open)

    def feed(self, chunk: bytes) -> tuple[Frame | None, Incoming | None]:
        """Consume one chunk; return a completed frame, or the progress of an open one."""
        if not isinstance(chunk, (bytes, bytearray)):
            raise ProtocolError("text message on a binary channel")
        if len(chunk) < _NEXT.size or chunk[:2] != MAGIC:
            raise ProtocolError("chunk without the Cotrain frame marker")
        if chunk[2] != WIRE_VERSION:
            raise ProtocolError(f"the other peer speaks wire v{chunk[2]}, this one v{WIRE_VERSION}: "
                                "one of you must update Cotrain")
        flags = chunk[3]
        if flags & FLAG_FIRST:
            return self._first(chunk, flags)
        _, _, _, msg_id = _NEXT.unpack_from(chunk)
        partial = self._open.get(msg_id)
        if partial is None:
            raise ProtocolError(f"continuation of unknown message {msg_id}")
        return self._append(msg_id, partial, memoryview(chunk)[_NEXT.size :], flags)

    def _first(self, chunk: bytes, flags: int) -> tuple[Frame | None, Incoming | None]:
        if len(chunk) < _FIRST.size:
            raise ProtocolError("truncated first chunk")
        _, _, _, msg_id, head_len, total = _FIRST.unpack_from(chunk)
        if msg_id in self._open:
            raise ProtocolError(f"message {msg_id} started twice")
        if head_len > MAX_HEADER or _FIRST.size + head_len > len(chunk):
            raise ProtocolError("frame header length out of range")
        if total > self.max_payload:
            raise ProtocolError(f"payload of {total} bytes exceeds the limit of {self.max_payload}")
        if len(self._open) >= self.max_open:
            raise ProtocolError("too many messages open at once")
        header = headers.decode(memoryview(chunk)[_FIRST.size : _FIRST.size + head_len])
        partial = _Partial(header=header, expected=total)
        self._open[msg_id] = partial
        return self._append(msg_id, partial, memoryview(chunk)[_FIRST.size + head_len :], flags)

    def _append(
        self, msg_id: int, partial: _Partial, data: memoryview, flags: int
    ) -> tuple[Frame | None, Incoming | None]:
        if len(partial.buffer) + len(data) > partial.expected:
            raise ProtocolError(f"message {msg_id} carries more bytes than it declared")
        if self._buffered + len(data) > self.max_buffered:
            raise ProtocolError(f"messages under way would hold more than {self.max_buffered} bytes")
        partial.buffer += data
        self._buffered += len(data)
        if flags & FLAG_LAST:
            del self._open[msg_id]
            self._buffered -= len(partial.buffer)
            if len(partial.buffer) != partial.expected:
                raise ProtocolError(f"message {msg_id} ended short of its declared size")
            return Frame(partial.header, partial.buffer), None
        return None, Incoming(msg_id, partial.header, len(partial.buffer), partial.expected)
