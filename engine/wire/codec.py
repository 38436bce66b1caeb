"""Encoding messages, and decoding untrusted bytes into them with one error type.

A ``Codec`` is built once per kind of input (the union of messages that may arrive on a
channel): decoding then checks the JSON, every field's type, range and size, the message
kind and the version in one pass of msgspec, and any problem becomes a ProtocolError that
says what was wrong -- never another exception, whatever the bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgspec

from engine.wire import ProtocolError

T = TypeVar("T")
_encoder = msgspec.json.Encoder()


def encode(message: Any) -> bytes:
    return _encoder.encode(message)


def encode_text(message: Any) -> str:
    """For channels that carry text (WebSocket text frames, JSON lines)."""
    return _encoder.encode(message).decode()


class _Envelope(msgspec.Struct):
    """Just the version of a message that did not decode: was it written by another release?"""

    v: Any = None


class Codec(Generic[T]):
    """Decodes ``type_`` (a Struct or a tagged union of Structs) from at most ``max_bytes``.

    ``version`` is the version field every message of this channel carries; when a message
    fails to decode and says it is of another version, ``mismatch(theirs)`` explains it.
    """

    def __init__(self, type_: Any, what: str, max_bytes: int, version: int | None = None,
                 mismatch: Callable[[int], str] | None = None) -> None:
        self.what = what
        self.max_bytes = max_bytes
        self.version = version
        self._mismatch = mismatch or (lambda theirs: f"version {theirs} is not supported, only {version}")
        self._decoder: msgspec.json.Decoder[T] = msgspec.json.Decoder(type_)

    def decode(self, data: bytes | bytearray | memoryview | str) -> T:
        if len(data) > self.max_bytes:
            raise ProtocolError(f"{self.what} larger than {self.max_bytes} bytes")
        try:
            return self._decoder.decode(data)
        except msgspec.ValidationError as exc:
            raise ProtocolError(self._version_problem(data) or f"{self.what}: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"{self.what} is not valid JSON: {exc}") from None
        except RecursionError:
            raise ProtocolError(f"{self.what} is nested too deeply") from None

    def _version_problem(self, data: bytes | bytearray | memoryview | str) -> str | None:
        if self.version is None:
            return None
        try:
            theirs = msgspec.json.decode(data, type=_Envelope).v
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        if isinstance(theirs, int) and not isinstance(theirs, bool) and theirs != self.version:
            return self._mismatch(theirs)
        return None


def decode_json(data: bytes | bytearray | memoryview | str, what: str, max_bytes: int) -> Any:
    """Untrusted JSON as plain values, for input that is rewritten before it is validated."""
    if len(data) > max_bytes:
        raise ProtocolError(f"{what} larger than {max_bytes} bytes")
    try:
        return msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(f"{what} is nested too deeply") from None


def convert(data: Any, type_: type[T], what: str) -> T:
    """Validate an already parsed value (a catalog entry, a task's parameters) as ``type_``."""
    try:
        return msgspec.convert(data, type_)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{what}: {exc}") from None


def to_builtins(message: Any) -> Any:
    """Plain dicts, lists and numbers, e.g. to compare with a JSON document."""
    return msgspec.to_builtins(message)
