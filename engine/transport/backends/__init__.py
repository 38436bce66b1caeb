"""Which WebRTC stacks this peer can run its links on, and which one a pair uses.

Native (libwebrtc, through wrtc) where it imports and starts, aiortc everywhere. A pair runs
native only when both ends have it: the offer names the stack it was made with and the
answerer takes that one if it has it, else its own (SDP is the same either way, so such a
mixed pair works, at the aiortc side's speed); each side remembers what the other has for
its next offer. A native stack that fails to import or to start is reported once, and the
peer goes on with aiortc. ``COTRAIN_TRANSPORT=auto`` is the default; ``aiortc`` or ``native``
forces one.
"""

from __future__ import annotations

import importlib
import logging
import os
from types import ModuleType

from engine.transport.backends import aiortc_patches
from engine.transport.backends.aiortc_backend import AiortcConnection
from engine.transport.connection import StackConnection
from engine.transport.ice import IceSettings
from engine.wire.types import Transport

log = logging.getLogger(__name__)

ENV = "COTRAIN_TRANSPORT"
AUTO = "auto"
DEFAULT = AUTO
_native: ModuleType | None = None
_native_problem: str | None = None  # why native is out, once known
_probed = False
_reported = False


class TransportUnavailable(RuntimeError):
    """The stack COTRAIN_TRANSPORT forces cannot run here."""


def forced() -> Transport | None:
    """The stack COTRAIN_TRANSPORT asks for (None: ``auto``, native where both ends have it)."""
    value = os.environ.get(ENV, DEFAULT).strip().lower()
    if value == AUTO:
        return None
    try:
        return Transport(value)
    except ValueError:
        raise TransportUnavailable(f"{ENV}={value!r}: expected one of "
                                   f"{', '.join([AUTO, *(t.value for t in Transport)])}") from None


def _native_module() -> ModuleType | None:
    global _native, _probed
    if not _probed:
        _probed = True
        try:
            _native = importlib.import_module("engine.transport.backends.native_backend")
        except Exception as exc:  # a missing wheel, a missing system library, a broken build
            _unavailable(f"{type(exc).__name__}: {exc}")
    return _native


def _unavailable(why: str) -> None:
    global _native, _native_problem, _reported
    _native, _native_problem, _reported = None, why, False
    _report()


def _report() -> None:
    """Say once why native is out -- to a peer that would have used it."""
    global _reported
    if _native_problem and not _reported and forced() is not Transport.AIORTC:
        _reported = True
        log.warning("fast data channels unavailable: %s; links run on aiortc", _native_problem)


def native_problem() -> str | None:
    """Why this peer's links cannot run native (None: they can, as far as we know)."""
    _native_module()
    return _native_problem


def available() -> list[Transport]:
    """The stacks this peer can use, the preferred first."""
    choice = forced()
    if choice is Transport.AIORTC:
        return [Transport.AIORTC]
    native = _native_module() is not None
    _report()
    if choice is Transport.NATIVE:
        if not native:
            raise TransportUnavailable(f"{ENV}=native, but the native stack cannot run: {_native_problem}")
        return [Transport.NATIVE]
    return [Transport.NATIVE, Transport.AIORTC] if native else [Transport.AIORTC]


def for_offer(mine: list[Transport], theirs: list[Transport] | None) -> Transport:
    """The stack for an offer to a peer that has ``theirs`` (None: not known yet)."""
    shared = [t for t in mine if theirs is None or t in theirs]
    return (shared or mine)[0]


def for_answer(mine: list[Transport], offered: Transport) -> Transport:
    return offered if offered in mine else mine[0]


def connect(transport: Transport, ice: IceSettings) -> StackConnection:
    """A new connection on ``transport``; a native stack that cannot start falls back to aiortc."""
    if transport is Transport.NATIVE:
        native = _native_module()
        if native is not None:
            try:
                return native.NativeConnection(ice)
            except Exception as exc:
                _unavailable(f"could not start: {type(exc).__name__}: {exc}")
                if forced() is Transport.NATIVE:
                    raise TransportUnavailable(f"{ENV}=native, but the native stack cannot run: "
                                               f"{_native_problem}") from exc
    return AiortcConnection(ice)


def restrict_host_addresses(addresses: list[str] | None) -> None:
    """Offer only ``addresses`` as host candidates, on every stack (None: every interface)."""
    aiortc_patches.restrict_host_addresses(addresses)
    native = _native_module()
    if native is not None:
        native.restrict_host_addresses(addresses or [])
